// Ring attention's merge of two blocks' outputs (row_kernels.h): a row kernel of its own, apart from
// the blocked attention's products.
#include <algorithm>  // std::max
#include <cmath>      // std::exp, std::log

#include "models/kernels/cpu/row_kernels.h"
#include "models/kernels/cpu/row_math.h"  // for_rows

namespace zeroth::gpt::cpu {

void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int n, int NH, int hs, size_t lse_ld) {
  const size_t Cq = static_cast<size_t>(NH) * hs;
  for_rows(static_cast<size_t>(n), 64, [&](size_t i) {
    float* o = out + i * Cq;
    const float* bo = block_out + i * Cq;
    for (int h = 0; h < NH; ++h) {
      float& m = lse[static_cast<size_t>(h) * lse_ld + i];
      const float mb = block_lse[static_cast<size_t>(h) * n + i];
      // Both outputs are normalised over their keys: weigh each by its share of the sum of both.
      const float top = std::max(m, mb), merged = top + std::log(std::exp(m - top) + std::exp(mb - top));
      const float wa = std::exp(m - merged), wb = std::exp(mb - merged);
      float* oh = o + static_cast<size_t>(h) * hs;
      const float* bh = bo + static_cast<size_t>(h) * hs;
      for (int c = 0; c < hs; ++c) oh[c] = wa * oh[c] + wb * bh[c];
      m = merged;
    }
  });
}

}  // namespace zeroth::gpt::cpu
