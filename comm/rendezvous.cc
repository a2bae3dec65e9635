// Launcher environments, in the order torchrun > Slurm > Open MPI.
#include "comm/rendezvous.h"

#include <sys/random.h>  // getrandom
#include <sys/stat.h>    // fstat

#include <charconv>  // std::from_chars
#include <cstdlib>   // std::getenv
#include <fstream>   // std::ifstream
#include <iterator>  // std::istreambuf_iterator

#include "comm/tcp_store.h"  // TcpStore
#include "core/env.h"        // kJobToken, kJobTokenFile
#include "core/error.h"

namespace zeroth {

namespace {

std::optional<std::string> var(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int int_var(const char* name, std::optional<int> fallback = std::nullopt) {
  auto text = var(name);
  if (!text) {
    if (fallback) return *fallback;
    ZEROTH_THROW(ConfigError, "environment variable {} is required by this launcher but not set", name);
  }
  int value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || value < 0) {
    ZEROTH_THROW(ConfigError, "environment variable {}='{}' is not a non-negative integer", name, *text);
  }
  return value;
}

void validate(const RendezvousInfo& info, const char* rank_var, const char* size_var) {
  if (info.world_size < 1) ZEROTH_THROW(ConfigError, "{}={} must be at least 1", size_var, info.world_size);
  if (info.rank >= info.world_size) {
    ZEROTH_THROW(ConfigError, "{}={} is not below {}={}", rank_var, info.rank, size_var, info.world_size);
  }
  if (info.local_rank >= info.local_world_size) {
    ZEROTH_THROW(ConfigError, "local rank {} is not below the local world size {} ({} launcher)", info.local_rank,
                 info.local_world_size, info.source);
  }
  if (info.master_port < 1 || info.master_port > 65535) {
    ZEROTH_THROW(ConfigError, "MASTER_PORT={} is not a TCP port (1-65535)", info.master_port);
  }
}

}  // namespace

std::string read_job_token_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) ZEROTH_THROW(ConfigError, "job token file {}: {}", path, zeroth::detail::errno_text(errno));
  if (!S_ISREG(st.st_mode)) ZEROTH_THROW(ConfigError, "job token file {} is not a regular file", path);
  if ((st.st_mode & 077) != 0) {
    ZEROTH_THROW(ConfigError, "job token file {} has mode {:o}: others than its owner can read or change it; chmod 600 {}", path,
                 st.st_mode & 0777, path);
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxJobTokenBytes + 1)
    ZEROTH_THROW(ConfigError, "job token file {} holds {} bytes; a token is at most {}", path, st.st_size, kMaxJobTokenBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZEROTH_THROW(ConfigError, "job token file {} cannot be opened: {}", path, zeroth::detail::errno_text(errno));
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) ZEROTH_THROW(ConfigError, "job token file {} is empty", path);
  if (token.size() > kMaxJobTokenBytes)
    ZEROTH_THROW(ConfigError, "job token file {} holds {} bytes; a token is at most {}", path, token.size(), kMaxJobTokenBytes);
  return token;
}

std::string job_token_from_env() {
  if (auto token = var(std::string(env::kJobToken).c_str())) {
    if (token->size() > kMaxJobTokenBytes)
      ZEROTH_THROW(ConfigError, "{} holds {} bytes; a token is at most {}", env::kJobToken, token->size(), kMaxJobTokenBytes);
    return *token;
  }
  if (auto path = var(std::string(env::kJobTokenFile).c_str())) return read_job_token_file(*path);
  return "";
}

std::string generate_job_token() {
  unsigned char bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ZEROTH_THROW(IoError, "getrandom({} bytes) failed: {}", sizeof bytes - got, zeroth::detail::errno_text(errno));
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) token += {kHex[b >> 4], kHex[b & 15]};
  return token;
}

std::string first_slurm_host(const std::string& nodelist) {
  const auto comma = nodelist.find(',');
  const auto bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return nodelist.substr(0, comma);
  const auto close = nodelist.find(']', bracket);
  if (close == std::string::npos) ZEROTH_THROW(ConfigError, "SLURM_JOB_NODELIST='{}' has an unclosed '['", nodelist);
  std::string first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find_first_of(",-"));
  return nodelist.substr(0, bracket) + first;
}

std::optional<RendezvousInfo> rendezvous_from_env() {
  RendezvousInfo info;
  if (var("RANK") || var("WORLD_SIZE")) {
    info.source = "torchrun";
    info.rank = int_var("RANK");
    info.world_size = int_var("WORLD_SIZE");
    info.local_rank = int_var("LOCAL_RANK", info.rank);
    info.local_world_size = int_var("LOCAL_WORLD_SIZE", info.world_size);
    info.master_addr = var("MASTER_ADDR").value_or("127.0.0.1");
    info.master_port = int_var("MASTER_PORT", 29500);
    validate(info, "RANK", "WORLD_SIZE");
    info.token = job_token_from_env();
    return info;
  }
  if (var("SLURM_PROCID") && var("SLURM_NTASKS")) {
    info.source = "slurm";
    info.rank = int_var("SLURM_PROCID");
    info.world_size = int_var("SLURM_NTASKS");
    info.local_rank = int_var("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; the node count is the fallback.
    const int nodes = int_var("SLURM_NNODES", 1);
    info.local_world_size = int_var("SLURM_NTASKS_PER_NODE", (info.world_size + nodes - 1) / nodes);
    if (auto addr = var("MASTER_ADDR")) info.master_addr = *addr;
    else if (auto nodelist = var("SLURM_JOB_NODELIST")) info.master_addr = first_slurm_host(*nodelist);
    info.master_port = int_var("MASTER_PORT", 29500);
    validate(info, "SLURM_PROCID", "SLURM_NTASKS");
    info.token = job_token_from_env();
    return info;
  }
  if (var("OMPI_COMM_WORLD_RANK") && var("OMPI_COMM_WORLD_SIZE")) {
    info.source = "openmpi";
    info.rank = int_var("OMPI_COMM_WORLD_RANK");
    info.world_size = int_var("OMPI_COMM_WORLD_SIZE");
    info.local_rank = int_var("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world_size = int_var("OMPI_COMM_WORLD_LOCAL_SIZE", info.world_size);
    if (auto addr = var("MASTER_ADDR")) {
      info.master_addr = *addr;
    } else if (info.local_world_size != info.world_size) {
      ZEROTH_THROW(ConfigError, "Open MPI job across several hosts: set MASTER_ADDR to the host of rank 0");
    }
    info.master_port = int_var("MASTER_PORT", 29500);
    validate(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    info.token = job_token_from_env();
    return info;
  }
  return std::nullopt;
}

void check_in(TcpStore& store, const RendezvousInfo& info) {
  const auto as_text = [](const std::vector<char>& v) { return std::string(v.begin(), v.end()); };
  const auto report = [&](const std::string& what) {
    if (store.add(std::string(kJobMismatchKey) + "/count", 1) == 1) store.set(kJobMismatchKey, {what.begin(), what.end()});
    return what;
  };
  if (store.add(fmt::format("job/rank/{}", info.rank), 1) > 1) {
    ZEROTH_THROW(CommError, "{}",
                 report(fmt::format("rank {} of the job started twice: two nodes were given the same node rank "
                                    "(--node-rank), or two processes the same rank ({} launcher): give each node its own",
                                    info.rank, info.source)));
  }
  // The first rank to check in sets the job's shape; the rest compare theirs with it.
  const std::string mine = fmt::format("{} {}", info.world_size, info.rank);
  if (store.add("job/shape/claims", 1) == 1) store.set("job/shape", {mine.begin(), mine.end()});
  const std::string first = as_text(store.get("job/shape"));
  const int first_world = std::stoi(first.substr(0, first.find(' ')));
  if (first_world == info.world_size) return;
  ZEROTH_THROW(ConfigError, "{}",
               report(fmt::format("rank {} was started for a job of {} ranks, rank {} for one of {} ({} launcher): every node "
                                  "must be launched with the same --nnodes and --nproc-per-node (-n), or the scheduler's task "
                                  "counts must agree",
                                  info.rank, info.world_size, first.substr(first.find(' ') + 1), first_world, info.source)));
}

}  // namespace zeroth
