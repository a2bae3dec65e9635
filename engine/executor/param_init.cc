// Counter-based initialization: a SplitMix64 hash of (seed, name, index) gives independent
// uniform draws; normals come from Box-Muller on two of them.
#include "engine/executor/param_init.h"

#include <cmath>  // std::sqrt, std::log, std::cos

#include "core/cpu/parallel.h"  // cpu::for_chunks

namespace zeroth {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// (0, 1], 53 bits.
double uniform(uint64_t key, uint64_t counter) { return (static_cast<double>(mix(key ^ mix(counter)) >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

void init_values(const InitRule& rule, uint64_t seed, std::string_view name, size_t begin, size_t count, float* out) {
  uint64_t key = 0xcbf29ce484222325ULL;  // FNV-1a of the name, then the seed
  for (unsigned char ch : name) key = (key ^ ch) * 0x100000001b3ULL;
  key = mix(key ^ mix(seed));
  auto fill = [&](size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; ++k) {
      const uint64_t i = begin + k;
      double v = 0;
      switch (rule.kind) {
        case InitRule::Kind::zeros: v = 0; break;
        case InitRule::Kind::constant: v = rule.a; break;
        case InitRule::Kind::uniform: v = rule.a + (rule.b - rule.a) * (1.0 - uniform(key, i)); break;
        case InitRule::Kind::normal: {
          const double u1 = uniform(key, 2 * i), u2 = uniform(key, 2 * i + 1);
          v = rule.a + rule.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
          break;
        }
      }
      out[k] = static_cast<float>(v);
    }
  };
  cpu::for_chunks(count, size_t{1} << 16, fill);
}

}  // namespace zeroth
