// Who this process is in a job, read from the launcher's environment: torchrun's (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else Slurm's, else Open MPI's.
#pragma once

#include <cstddef>   // std::size_t
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
  std::string token;   // the job's secret (job_token_from_env); empty when none is set
};

// nullopt when no launcher variables are set (a single process, or local ranks as threads).
// Inconsistent or malformed variables raise ConfigError naming them.
std::optional<RendezvousInfo> rendezvous_from_env();

// The job's secret that every connection to the rendezvous store presents: ZEROTH_JOB_TOKEN,
// else the contents of the file ZEROTH_JOB_TOKEN_FILE names; empty when neither is set.
std::string job_token_from_env();
// A token file's secret, its trailing newline dropped. ConfigError when the file is missing,
// empty, longer than kMaxJobTokenBytes, or readable or writable by others than its owner (as ssh
// treats private keys: a secret others can read is no secret).
std::string read_job_token_file(const std::string& path);
// 32 random bytes from the kernel, as 64 hex digits.
std::string generate_job_token();
inline constexpr std::size_t kMaxJobTokenBytes = 1024;

class TcpStore;
// Every rank of a job checks in with the store (`store`, the job's): CommError when another rank
// already checked in as this rank (two nodes given one --node-rank), ConfigError when this rank's
// world size differs from the first rank's to check in (nodes given different --nnodes or -n).
// The first such report stays in the store under kJobMismatchKey, for the ranks that agreed with
// the first and now wait in vain. Without it they would wait for each other until the timeout.
void check_in(TcpStore& store, const RendezvousInfo& info);
inline constexpr const char* kJobMismatchKey = "job/mismatch";

// The first host of a Slurm node list: "gpu[03-07,09],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace zeroth
