// Pass orders: the sequential and 1F1B orders of a cycle, and the checks make_plan runs on a
// model's chunk schedules and on any pass order (a pipeline schedule's among them).
#include <algorithm>  // std::max, std::clamp

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW
#include "engine/plan/plan.h"

namespace zeroth {

// Every block used forward and backward, in exactly one chunk.
void check_block_schedules(const std::vector<BlockSchedule>& chunks, size_t n) {
  std::vector<int> seen_f(n, 0), seen_b(n, 0), chunk_of(n, -1);
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (const auto* order : {&chunks[c].forward, &chunks[c].backward}) {
      const char* pass = order == &chunks[c].forward ? "forward" : "backward";
      for (int b : *order) {
        if (b < 0 || static_cast<size_t>(b) >= n)
          ZEROTH_THROW(ConfigError, "block schedule: {} names block {}, but there are {} blocks", pass, b, n);
        if (chunk_of[b] >= 0 && chunk_of[b] != static_cast<int>(c))
          ZEROTH_THROW(ConfigError, "block schedule: block {} is used by model chunks {} and {}; a block belongs to one chunk", b,
                       chunk_of[b], c);
        chunk_of[b] = static_cast<int>(c);
        ++(order == &chunks[c].forward ? seen_f : seen_b)[b];
      }
    }
  }
  for (size_t b = 0; b < n; ++b) {
    if (seen_f[b] == 0 || seen_b[b] == 0) {
      ZEROTH_THROW(
          ConfigError,
          "block schedule: block {} is never used in the {} pass; every block must be used in both (frozen blocks are not supported)",
          b, seen_f[b] == 0 ? "forward" : "backward");
    }
  }
}

// Every micro-batch of the cycle once forward and once backward per chunk, forward first;
// each chunk's forwards in micro-batch order and its backwards too, so the micro-batches in flight
// in a chunk are consecutive. Returns the most in flight in each chunk.
std::vector<int> check_passes(const std::vector<PassRef>& passes, int micro_batches, int chunks) {
  std::vector<int> next_f(chunks, 0), next_b(chunks, 0), most(chunks, 0);
  for (const auto& p : passes) {
    const bool fwd = p.pass == Pass::forward;
    if (p.chunk < 0 || p.chunk >= chunks)
      ZEROTH_THROW(ConfigError, "pass order: a pass of micro-batch {} names model chunk {}, but there are {}", p.micro, p.chunk,
                   chunks);
    int& next = fwd ? next_f[p.chunk] : next_b[p.chunk];
    if (p.micro != next || p.micro >= micro_batches || (!fwd && next_b[p.chunk] >= next_f[p.chunk])) {
      ZEROTH_THROW(ConfigError,
                   "pass order: {} of micro-batch {}{} comes out of order; each of the {} micro-batches of a cycle runs forward then "
                   "backward, forwards in micro-batch order and backwards too",
                   fwd ? "forward" : "backward", p.micro, chunks > 1 ? fmt::format(" (chunk {})", p.chunk) : "", micro_batches);
    }
    ++next;
    most[p.chunk] = std::max(most[p.chunk], next_f[p.chunk] - next_b[p.chunk]);
  }
  for (int c = 0; c < chunks; ++c) {
    if (next_f[c] != micro_batches || next_b[c] != micro_batches) {
      ZEROTH_THROW(ConfigError,
                   "pass order: it has {} forward and {} backward passes{}, but the cycle has {} micro-batches "
                   "(gradient_accumulation_steps)",
                   next_f[c], next_b[c], chunks > 1 ? fmt::format(" of chunk {}", c) : "", micro_batches);
    }
  }
  return most;
}

std::vector<PassRef> sequential_passes(int micro_batches) {
  std::vector<PassRef> out;
  for (int m = 0; m < micro_batches; ++m) {
    out.push_back({m, Pass::forward});
    out.push_back({m, Pass::backward});
  }
  return out;
}

std::vector<PassRef> one_f_one_b_passes(int micro_batches, int in_flight) {
  const int k = std::clamp(in_flight, 1, std::max(1, micro_batches));
  std::vector<PassRef> out;
  for (int m = 0; m < k; ++m) out.push_back({m, Pass::forward});
  for (int m = 0; m < micro_batches; ++m) {
    out.push_back({m, Pass::backward});
    if (m + k < micro_batches) out.push_back({m + k, Pass::forward});
  }
  return out;
}

}  // namespace zeroth
