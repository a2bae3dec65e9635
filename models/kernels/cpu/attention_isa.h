// The inner loops of the CPU's blocked attention (attention.cc): its products and the softmax's row
// passes, one body (attention_tile.inc) built per ISA. Every level gives the same bits: a product's
// output is a chain of fused multiply-adds in k order, a query's sums run down the keys in order,
// and the exp is the same fused polynomial.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // uint32_t

#include "core/cpu/kernels.h"  // SimdLevel

namespace zeroth::gpt::cpu {

// Where a causal product's terms or outputs are known to be nothing: the part of a diagonal chunk
// the mask hides. A tile (a few rows) skips what is nothing for all of its rows.
enum class Zeros {
  none,
  columns_before,  // C's row i is wanted only from column i + shift on; the rest may be left unwritten
  k_after,         // row i's terms past k = i + shift are 0: A's element is 0 there
  k_before,        // row i's terms before k = i + shift are 0
};

// C[m, n] = alpha A B, plus C where `accumulate` (rows scaled as below). A's element (i, k) is
// a[i a_row + k a_col] (either orientation); B's row k is n elements at b + k ldb; C's row i is n
// floats at c + i ldc.
// Term is float (Product) or a pair of bf16 (PairProduct): the low half term 2k, the high half term
// 2k + 1, so k counts pairs, A's element (i, k) holds row i's terms 2k and 2k + 1, and B's row k
// holds rows 2k and 2k + 1 interleaved. A pair product adds a row's two terms, odd then even, to its
// accumulator with a rounding after each, as AVX512-BF16's vdpbf16ps does; the products of bf16 are
// exact in f32. `shift` counts terms, not pairs.
template <class Term>
struct ProductOf {
  int m, n, k;
  float alpha;
  const Term* a;
  size_t a_row, a_col;
  const Term* b;
  size_t ldb;
  float* c;
  size_t ldc;
  bool accumulate;
  Zeros zeros = Zeros::none;
  int shift = 0;
  // Where given, C's row i times scale_c[i] before the product is added to it (with `accumulate`),
  // and the sum's row i times scale_out[i]: the online softmax's rescaling of the output so far and
  // its final 1 / l, without passes of their own. Only where the product writes all of C: not with
  // Zeros::columns_before, whose skipped part would stay unscaled.
  const float* scale_c = nullptr;
  const float* scale_out = nullptr;
};
using Product = ProductOf<float>;
using PairProduct = ProductOf<uint32_t>;

// Query rows per block: the column passes run over this many lanes. A chunk of scores is held
// transposed, [keys, kBlockRows] (key j's scores against the block's queries in row j), so every
// softmax pass is element-wise across the queries and sums run down the keys in order.
inline constexpr int kBlockRows = 64;

// Pairs past `lanes` in the bf16 outputs, up to the next 32 lanes, may be written with any value.
// The softmax passes run over the first `lanes` queries of each row (a multiple of 16, at most
// kBlockRows: a block's rows rounded up, so generation's single row costs 16 lanes, not 64).
struct AttentionIsa {
  void (*product)(const Product& p);
  // The same on bf16 pairs: attention's products in a bf16 run.
  void (*pair_product)(const PairProduct& p);
  // The online softmax's step over a chunk of n keys: per query lane, m' = max(m, the chunk's
  // scores); st = exp(st - m') (0 where that is below -87: masked scores are -3e38); l = the sum
  // of st over the chunk (`first`), else l exp(m - m') + that sum, with exp(m - m') in alpha;
  // m = m'. With `row_pairs` the exps go there instead, as bf16 by pairs of keys (row j / 2 of
  // kBlockRows pairs: keys j and j + 1 of each lane; a last odd key's partner 0), and st is left
  // as it was.
  void (*softmax_chunk)(float* st, int n, int lanes, float* m, float* l, float* alpha, bool first, uint32_t* row_pairs);
  // st = exp(st - lse), lse per query lane; with `along`, also as bf16 pairs along each key's row
  // (row j of kBlockRows / 2 pairs: lanes 2i and 2i + 1).
  void (*probabilities_chunk)(float* st, int n, int lanes, const float* lse, uint32_t* along);
  // dst = pt (dst - d) scale, d per query lane. With `along` or `row_pairs` (or both), the result
  // goes to those given as bf16 pairs (as above) instead, and dst is left as it was.
  void (*softmax_grad_chunk)(float* dst, const float* pt, int n, int lanes, const float* d, float scale, uint32_t* along,
                             uint32_t* row_pairs);
  // dst [hs, kBlockRows] = the `rows` rows (at most kBlockRows) of hs floats at src, ld apart,
  // transposed; 0 in the lanes past `rows` up to rows rounded up to 16, the rest left as it was.
  void (*transpose)(float* dst, const float* src, int rows, size_t ld, int hs);
  // The same on 32-bit pairs of bf16: a block's rows of hs pairs.
  void (*transpose_pairs)(uint32_t* dst, const uint32_t* src, int rows, size_t ld, int hs);
  // dst's row r (ldd apart) = src's row r (ld apart) of `width` floats rounded to bf16 and paired
  // along the row ((width + 1) / 2 pairs; a last odd value's partner 0), for r < rows.
  void (*pack_along_rows)(uint32_t* dst, size_t ldd, const float* src, size_t ld, int rows, int width);
  // dst's row r (ldd apart) = src's rows 2r and 2r + 1 (ld apart) of `width` floats rounded to bf16
  // and paired column by column, for r < (rows + 1) / 2; the row past `rows` counts as 0.
  void (*pack_row_pairs)(uint32_t* dst, size_t ldd, const float* src, size_t ld, int rows, int width);
};

const AttentionIsa& attention_isa_scalar();
const AttentionIsa& attention_isa_avx2();
const AttentionIsa& attention_isa_avx512();
const AttentionIsa& attention_isa_avx512_bf16();  // pair products on vdpbf16ps
// The level's loops; AVX2 only where the CPU has FMA too, else the scalar level's; on AVX-512 the
// pair products take vdpbf16ps where the CPU has AVX512-BF16.
const AttentionIsa& attention_isa(zeroth::cpu::SimdLevel level);

}  // namespace zeroth::gpt::cpu
