// The one chunked parallel loop of the CPU code: fixed chunks (so results never depend on the
// thread count), over oneTBB when kernels may use several threads, in order on the calling thread
// when they may use one (a rank per core, or a TSan run), outside any task arena shared by the
// rank threads of a process.
#pragma once

#include <tbb/parallel_for.h>  // tbb::parallel_for

#include <algorithm>  // std::min
#include <cstddef>    // size_t

#include "core/cpu/kernels.h"  // num_threads

namespace zeroth::cpu {

// body(begin, end) over [0, n) in chunks of `chunk` items; one chunk stays on the calling thread.
template <class Body>
void for_chunks(size_t n, size_t chunk, Body&& body) {
  const size_t chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1) {
    if (n > 0) body(size_t{0}, n);
    return;
  }
  if (num_threads() == 1) {
    for (size_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t c = r.begin(); c != r.end(); ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
  });
}

}  // namespace zeroth::cpu
