// The `local` backend: N ranks as threads of one process sharing memory. Collectives copy
// straight between the ranks' buffers with device kernels on each rank's own stream, reduce in
// rank order (deterministic, identical on every rank), and work for any Device (CPU, CUDA).
#pragma once

#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <vector>      // std::vector

#include "comm/communicator.h"

namespace zeroth {

// `size` communicators of one group; hand communicator r to the thread that runs rank r.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size, CommOptions options = CommOptions::from_env());

// Runs fn(comm) for every rank on its own thread and waits for all. The first rank to throw
// aborts the group (the others' pending collectives fail with a CommError naming it), and its
// error is rethrown here.
void run_local_ranks(int size, const std::function<void(Communicator&)>& fn, CommOptions options = CommOptions::from_env());

}  // namespace zeroth
