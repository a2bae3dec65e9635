// The operands of one block of ring attention's work, shared by the kernels' interface and the CPU's.
#pragma once

#include <cstddef>  // size_t

namespace zeroth::gpt {

// Ring attention's work (context parallelism): one sequence's n query rows (ldq floats apart, query
// head h at column h hs) against n key/value rows of another part of it (ldkv apart, key/value head j's
// keys at column j hs, its values at (KVH + j) hs). `diagonal`: the queries' own rows (query i sees
// keys up to i); else rows wholly before the queries (every query sees every key).
struct AttentionBlock {
  const float* q;
  size_t ldq;
  const float* kv;
  size_t ldkv;
  int n, NH, KVH, hs;
  bool diagonal;
  size_t lse_ld;  // floats from one head's log-sum-exp row to the next's (n for a block's own)
};

}  // namespace zeroth::gpt
