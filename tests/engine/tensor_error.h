// One weight tensor compared with a reference, relative to the tensor itself: its largest
// |difference| over its largest |value|, and the relative L2 error.
#pragma once

#include <algorithm>  // std::max, std::fill
#include <cmath>      // std::abs, std::sqrt
#include <string>     // std::string
#include <vector>     // std::vector

namespace zeroth::testing {

struct TensorError {
  std::string name;
  double max_abs = 0, scale = 0, l2_rel = 0;
  double rel() const { return max_abs / std::max(scale, 1e-30); }
};

inline TensorError compare(const std::string& name, std::vector<float> got, std::vector<float> ref) {
  if (name.ends_with("attn.c_attn.bias")) {
    // The key bias adds the same q.b to every score of a row, which softmax ignores: its gradient
    // is zero up to rounding, and Adam turns that rounding noise into full-size steps of either
    // sign, in PyTorch as here. Only the query and value biases are compared.
    const size_t C = ref.size() / 3;
    std::fill(got.begin() + C, got.begin() + 2 * C, 0.0f);
    std::fill(ref.begin() + C, ref.begin() + 2 * C, 0.0f);
  }
  TensorError e{name};
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    e.max_abs = std::max(e.max_abs, std::abs(d));
    e.scale = std::max(e.scale, std::abs(static_cast<double>(ref[i])));
    diff2 += d * d, ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  e.l2_rel = std::sqrt(diff2 / std::max(ref2, 1e-60));
  return e;
}

}  // namespace zeroth::testing
