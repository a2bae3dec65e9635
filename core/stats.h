// Small statistics for timings: benchmarks and the training loop report medians, which noisy
// machines make more telling than means.
#pragma once

#include <algorithm>  // std::nth_element
#include <chrono>     // std::chrono::steady_clock
#include <vector>     // std::vector

namespace zeroth {

// The upper median (the middle element of the sorted values); 0 for no values.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// fn() once untimed (page faults and first-call set-up are not what is measured), then `reps`
// timed calls: their median in seconds.
template <class F>
double median_seconds(int reps, F&& fn) {
  fn();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(seconds);
}

}  // namespace zeroth
