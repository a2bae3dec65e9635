// Parameter initialization that depends on the seed and the parameter's name only: element i of
// a parameter is a pure function of (seed, name, i), so any rank can fill any shard of it and
// every world size starts from the same weights.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint64_t
#include <string_view>  // std::string_view

#include "models/block_api.h"  // InitRule

namespace zeroth {

// Writes elements [begin, begin + count) of the named parameter into out.
void init_values(const InitRule& rule, uint64_t seed, std::string_view name, size_t begin, size_t count, float* out);

}  // namespace zeroth
