// How many threads one rank's kernels use. Ranks that share a machine (threads of one process on
// the local backend, or processes started on one node) must split its cores: a BLAS call that
// spreads over every core while three other ranks do the same spends its time switching, not
// computing (measured: 2.7x slower with 4 ranks on 2 cores).
#pragma once

namespace zeroth {

// Sets the thread count of the CPU kernels (oneTBB) and of the GEMMs to cores / ranks_per_machine
// (at least 1), unless ZEROTH_NUM_THREADS or OPENBLAS_NUM_THREADS say otherwise. Returns the
// count the kernels use.
int share_cores(int ranks_per_machine);

}  // namespace zeroth
