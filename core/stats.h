// Small statistics for timings: benchmarks and the training loop report medians, which noisy
// machines make more telling than means.
#pragma once

#include <algorithm>  // std::nth_element
#include <vector>     // std::vector

namespace zeroth {

// The upper median (the middle element of the sorted values); 0 for no values.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace zeroth
