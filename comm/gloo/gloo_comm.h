// The `gloo` backend: ranks as processes on one or many hosts over TCP, through the Gloo
// library's transport. Collectives run on the caller's (CPU) stream; rings on Gloo's unbound
// buffers give every dtype, f32 accumulation for bf16/f16, timeouts and errors that name the peer.
#pragma once

#include <memory>  // std::unique_ptr

#include "comm/communicator.h"
#include "comm/rendezvous.h"

namespace zeroth {

// Collective over all ranks of the job: rank 0 hosts the rendezvous store at
// MASTER_ADDR:MASTER_PORT, every rank connects, and the ranks connect to each other.
std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousInfo& info, CommOptions options = CommOptions::from_env());

}  // namespace zeroth
