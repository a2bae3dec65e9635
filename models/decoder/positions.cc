// A micro-batch's positions as the passes use them: its samples and the embedding's runs.
#include <array>   // std::array
#include <memory>  // std::make_shared
#include <vector>  // std::vector

#include "core/error.h"             // ZEROTH_THROW
#include "models/decoder/layers.h"  // Spans, Runs

namespace zeroth::gpt {

Spans spans_of(const int32_t* positions, int B, int T) {
  if (positions == nullptr) return nullptr;
  auto spans = std::make_shared<std::vector<std::array<int, 2>>>();
  for (int b = 0; b < B; ++b) {
    const int32_t* row = positions + static_cast<size_t>(b) * T;
    for (int t = 0; t < T; ++t) {
      if (row[t] == 0) {
        spans->push_back({b * T + t, 0});
      } else if (t == 0 || row[t] != row[t - 1] + 1) {
        ZEROTH_THROW(InvalidArgument,
                     "position {} at row {}, column {}: a row starts at 0 and each position is 0 (a new sample) or one "
                     "more than the one before",
                     row[t], b, t);
      }
      ++spans->back()[1];
    }
  }
  if (spans->size() == static_cast<size_t>(B)) return nullptr;  // one sample a row: the rows as they are
  return spans;
}

Runs runs_of(const int32_t* positions, int B, int T, int ranks, int rank) {
  if (positions == nullptr) return nullptr;
  auto runs = std::make_shared<std::vector<std::array<int, 3>>>();
  for (int b = 0; b < B; ++b) {
    const int32_t* row = positions + static_cast<size_t>(b) * T * ranks + static_cast<size_t>(rank) * T;
    for (int t = 0; t < T; ++t) {
      if (t == 0 || row[t] != row[t - 1] + 1) runs->push_back({b * T + t, 0, row[t]});
      ++runs->back()[1];
    }
  }
  return runs;
}

Runs ring_runs(int B, int T, int ranks, int rank) {
  auto runs = std::make_shared<std::vector<std::array<int, 3>>>();
  const int c = T / 2;
  for (int b = 0; b < B; ++b) {
    for (int slot = 0; slot < 2; ++slot) runs->push_back({b * T + slot * c, c, ring_chunk(ranks, rank, slot) * c});
  }
  return runs;
}

}  // namespace zeroth::gpt
