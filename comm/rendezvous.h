// Who this process is in a job, read from the launcher's environment: torchrun's (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else Slurm's, else Open MPI's.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string

namespace zeroth {

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source;  // "torchrun", "slurm" or "openmpi"
};

// nullopt when no launcher variables are set (a single process, or local ranks as threads).
// Inconsistent or malformed variables raise ConfigError naming them.
std::optional<RendezvousInfo> rendezvous_from_env();

// The first host of a Slurm node list: "gpu[03-07,09],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace zeroth
