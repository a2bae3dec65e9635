// The `nccl` backend: one GPU per rank, NCCL communicators bootstrapped through the job's TCP
// store (rank 0 makes the unique id), collectives on the caller's CUDA stream, ncclCommSplit for
// groups, and a watchdog that aborts the communicator when an op outlives the timeout.
#pragma once

#include <memory>  // std::unique_ptr

#include "comm/communicator.h"
#include "comm/rendezvous.h"

namespace zeroth {

// Collective over all ranks of the job. `gpu` is the CUDA device index this rank drives
// (usually LOCAL_RANK). Throws CommError without the CUDA backend or a GPU.
std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousInfo& info, int gpu,
                                                     CommOptions options = CommOptions::from_env());

// NCCL's version as "2.28.9", or why it cannot be had.
std::string nccl_version();

}  // namespace zeroth
