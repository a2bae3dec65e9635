// The process launcher. One poll loop watches every child's stdout and stderr pipes and a
// signalfd for SIGCHLD and the signals to forward; each child runs in its own process group so
// that stopping a rank also stops what it started.
#include "tools/launch/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "comm/rendezvous.h"  // job_token_from_env, read_job_token_file, generate_job_token
#include "core/error.h"
#include "comm/communicator.h"             // CommOptions
#include "tools/launch/node_rendezvous.h"  // NodeRendezvous
#include "tools/launch/process.h"          // spawn_child, exit_code

namespace zeroth::tools {

namespace launch_launcher {

using clock = std::chrono::steady_clock;

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  int out_fd = -1, err_fd = -1;
  std::string out_partial, err_partial;
};

int pick_free_port() {
  const int fd = SYSCALL_CHECK(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  SYSCALL_CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr));
  socklen_t len = sizeof addr;
  SYSCALL_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len));
  ::close(fd);
  return ntohs(addr.sin_port);
}

// rank < 0: no prefix.
void write_line(FILE* out, int rank, std::string_view line) {
  if (rank >= 0) std::fprintf(out, "[rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
  else std::fprintf(out, "%.*s\n", static_cast<int>(line.size()), line.data());
}

// Moves complete lines from `partial` + new bytes to `out`, prefixed with the rank.
void emit(FILE* out, int rank, std::string& partial, const char* data, size_t n) {
  partial.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    write_line(out, rank, std::string_view(partial).substr(start, nl - start));
  }
  partial.erase(0, start);
  std::fflush(out);
}

pthread_t g_launcher_thread;

void pass_to_launcher_thread(int sig) {
  if (!::pthread_equal(::pthread_self(), g_launcher_thread)) ::pthread_kill(g_launcher_thread, sig);
}

void signal_group(const Rank& r, int sig) {
  if (r.running) ::kill(-r.pid, sig);  // the child's whole process group
}

// How one start of the job ended.
struct Outcome {
  int code = 0;            // the job's: the first failing rank's exit code, 0 when all succeeded
  bool signalled = false;  // ended by a signal to the launcher, forwarded to the ranks
  bool elsewhere = false;  // ended because the start failed on another node
  std::string cause;       // what failed first, for the log
};

// Another node's report that the start failed there (none when the job has one node).
using OtherNodes = std::function<std::optional<NodeFailure>()>;

// The first signal waiting on `sig_fd` other than SIGCHLD, 0 when none; reads them all.
int take_signal(int sig_fd) {
  int first = 0;
  signalfd_siginfo info{};
  while (::read(sig_fd, &info, sizeof info) == sizeof info)
    if (info.ssi_signo != SIGCHLD && first == 0) first = static_cast<int>(info.ssi_signo);
  return first;
}

// One start of the job: its ranks started, watched and reaped. `sig_fd` reads the signals to
// forward; `previous` and `handled` are the mask and signals the children get back.
// Long: one start's life (spawn the ranks, then the poll loop over their output, signals, exits and the other nodes); the
// loop's branches share `failed`, `outcome` and the kill deadline.
Outcome run_attempt(const LaunchOptions& o, int attempt, int port, const std::string& token, int sig_fd, const sigset_t& previous,
                    const sigset_t& handled, const OtherNodes& other_nodes) {
  const int world = o.nproc_per_node * o.nnodes;
  std::vector<Rank> ranks(o.nproc_per_node);
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Rank& r = ranks[i];
    r.index = o.node_rank * o.nproc_per_node + i;
    std::map<std::string, std::string> vars = {{"RANK", std::to_string(r.index)},
                                               {"LOCAL_RANK", std::to_string(i)},
                                               {"WORLD_SIZE", std::to_string(world)},
                                               {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
                                               {"GROUP_RANK", std::to_string(o.node_rank)},
                                               {"MASTER_ADDR", o.master_addr},
                                               {"MASTER_PORT", std::to_string(port)},
                                               {"ZEROTH_JOB_TOKEN", token},
                                               {"ZEROTH_RESTART_COUNT", std::to_string(attempt)},
                                               {"ZEROTH_JOB_STARTED", std::to_string(o.job_started)}};
    // Like torchrun's OMP_NUM_THREADS: ranks sharing a host split its cores unless told otherwise.
    if (std::getenv("ZEROTH_NUM_THREADS") == nullptr) {
      const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
      vars["ZEROTH_NUM_THREADS"] = std::to_string(std::max(1L, cores / o.nproc_per_node));
    }
    // Each rank its own process group, so stopping it stops what it started; the signals this
    // thread takes through its signalfd get their defaults and mask back in the child.
    SpawnOptions spawn;
    spawn.env = std::move(vars);
    spawn.new_group = true;
    spawn.mask = &previous;
    spawn.defaults = &handled;
    try {
      const Child child = spawn_child(o.command, spawn);
      r.pid = child.pid, r.out_fd = child.out_fd, r.err_fd = child.err_fd;
    } catch (const Error& e) {
      for (auto& started : ranks) signal_group(started, SIGKILL);
      ZEROTH_THROW(IoError, "rank {}: {}", r.index, e.what());
    }
    r.running = true;
  }

  Outcome outcome;
  bool failed = false;
  // When the ranks still alive get SIGKILL; clock::time_point::max() while none is due.
  clock::time_point kill_at = clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& r : ranks) signal_group(r, sig);
    if (kill_at == clock::time_point::max()) kill_at = clock::now() + o.kill_grace;
  };
  auto next_look = clock::now();  // at the other nodes' reports, at most every 200 ms

  for (;;) {
    std::vector<pollfd> fds{{sig_fd, POLLIN, 0}};
    std::vector<std::pair<Rank*, bool>> owners{{nullptr, false}};
    for (auto& r : ranks) {
      if (r.out_fd >= 0) fds.push_back({r.out_fd, POLLIN, 0}), owners.push_back({&r, false});
      if (r.err_fd >= 0) fds.push_back({r.err_fd, POLLIN, 0}), owners.push_back({&r, true});
    }
    const bool any_running = std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; });
    if (!any_running && fds.size() == 1) break;
    int timeout_ms = 200;
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      ZEROTH_THROW(IoError, "poll over {} child pipes failed: {}", fds.size() - 1, detail::errno_text(errno));
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [rank, is_err] = owners[k];
      int& fd = is_err ? rank->err_fd : rank->out_fd;
      std::string& partial = is_err ? rank->err_partial : rank->out_partial;
      char buf[65536];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        emit(is_err ? stderr : stdout, o.prefix_output ? rank->index : -1, partial, buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        if (!partial.empty()) write_line(is_err ? stderr : stdout, o.prefix_output ? rank->index : -1, partial);
        partial.clear();
        ::close(fd);
        fd = -1;
      }
    }
    if (fds[0].revents != 0) {
      if (const int sig = take_signal(sig_fd)) {
        // Forward to every rank; they decide how to stop. A second signal is not needed: the
        // grace period ends in SIGKILL. A signal ends the job, after a failure too: no restart.
        std::fprintf(stderr, "zeroth launch: got signal %d, forwarding to %d rank(s)\n", sig, o.nproc_per_node);
        stop_all(sig);
        if (!failed) outcome = {128 + sig, true, false, fmt::format("signal {} to the launcher", sig)};
        outcome.signalled = true;
        failed = true;
      }
    }
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.exit_code = exit_code(status);
      if (r.exit_code != 0 && !failed) {
        failed = true;
        outcome.code = r.exit_code;
        outcome.cause = WIFSIGNALED(status) ? fmt::format("rank {} was killed by signal {} ({})", r.index, WTERMSIG(status),
                                                          ::strsignal(WTERMSIG(status)))
                                            : fmt::format("rank {} exited with code {}", r.index, r.exit_code);
        std::fprintf(stderr, "zeroth launch: %s; stopping the other ranks\n", outcome.cause.c_str());
        stop_all(SIGTERM);
      }
      // Whatever the rank started in its group goes with it.
      ::kill(-r.pid, SIGKILL);
    }
    if (!failed && other_nodes && clock::now() >= next_look) {
      next_look = clock::now() + std::chrono::milliseconds(200);
      if (auto elsewhere = other_nodes()) {
        failed = true;
        outcome = {1, elsewhere->final, true, elsewhere->cause};
        std::fprintf(stderr, "zeroth launch: the job failed on %s; stopping this node's ranks\n", elsewhere->cause.c_str());
        stop_all(SIGTERM);
      }
    }
    if (clock::now() >= kill_at) {
      for (auto& r : ranks) signal_group(r, SIGKILL);
      kill_at = clock::time_point::max();
    }
  }
  return outcome;
}

}  // namespace launch_launcher

// Long: the checks, the job token, the signal plumbing, the node rendezvous and the restart loop; the signalfd and the mask
// set up here are closed and restored after the loop.
int run_launch(const LaunchOptions& o) {
  using namespace launch_launcher;
  ZEROTH_CHECK(o.nproc_per_node >= 1, "--nproc-per-node (-n) must be at least 1, got {}", o.nproc_per_node);
  ZEROTH_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, got {}", o.nnodes);
  ZEROTH_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} must be in [0, {})", o.node_rank, o.nnodes);
  ZEROTH_CHECK(o.min_nodes() >= 1 && o.min_nodes() <= o.nnodes, "--nnodes {}:{}: MIN must be in [1, MAX]", o.min_nnodes, o.nnodes);
  ZEROTH_CHECK(o.last_call.count() >= 0, "--last-call must be 0 or more seconds, got {}", o.last_call.count());
  ZEROTH_CHECK(o.min_nodes() == o.nnodes || o.max_restarts > 0,
               "--nnodes {}:{} lets a restart go on with fewer nodes, but --max-restarts is 0: give the restarts too", o.min_nnodes,
               o.nnodes);
  ZEROTH_CHECK(o.max_restarts >= 0, "--max-restarts must be 0 or more, got {}", o.max_restarts);
  ZEROTH_CHECK(!o.command.empty(), "no command to launch: put it after --, e.g. zeroth launch -n 2 -- zeroth train config.json");
  // The rendezvous store lets in only connections that present this.
  std::string token = o.token_file.empty() ? job_token_from_env() : read_job_token_file(o.token_file);
  if (token.empty() && o.nnodes > 1) {
    ZEROTH_THROW(ConfigError,
                 "--nnodes {}: the ranks of every node must share one secret, or the rendezvous store at {} would let in "
                 "anyone who reaches it: pass --token-file FILE (the same file, mode 600, on every node) or set ZEROTH_JOB_TOKEN",
                 o.nnodes, o.master_addr);
  }
  if (token.empty()) token = generate_job_token();

  // Signals arrive through a signalfd; children get the default dispositions and mask back.
  // Threads that libraries started before main (OpenBLAS's pool) do not block them, so a signal
  // sent to the process may land there: a handler passes it on to this thread.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&handled, sig);
  g_launcher_thread = ::pthread_self();
  struct sigaction forward {};
  forward.sa_handler = pass_to_launcher_thread;
  forward.sa_flags = SA_RESTART;
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    if (::sigaction(sig, &forward, nullptr) != 0) ZEROTH_THROW(IoError, "sigaction({}) failed: {}", sig, detail::errno_text(errno));
  }
  sigset_t previous;
  if (sigprocmask(SIG_BLOCK, &handled, &previous) != 0) ZEROTH_THROW(IoError, "sigprocmask failed: {}", detail::errno_text(errno));
  const int sig_fd = SYSCALL_CHECK(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));

  // Across nodes, restarts need the launchers to agree on each start: node 0's launcher hosts a
  // store of theirs at the base port, each start's ranks use the ports above it.
  const int base_port = o.master_port != 0 ? o.master_port : 29500;
  std::unique_ptr<NodeRendezvous> nodes;
  if (o.nnodes > 1 && (o.max_restarts > 0 || o.min_nodes() < o.nnodes))
    nodes = std::make_unique<NodeRendezvous>(o, base_port, token, CommOptions::from_env().timeout);
  Outcome outcome;
  const int64_t job_started =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (int attempt = 0;; ++attempt) {
    LaunchOptions start = o;
    start.job_started = job_started;
    // Each start its own store: a rank of the next one never reaches the last one's, still
    // winding down.
    int port = o.nnodes == 1 && o.master_port == 0 ? pick_free_port() : base_port + attempt;
    OtherNodes other_nodes;
    if (nodes) {
      int sig = 0;
      NodeRound round;
      const auto joined = nodes->join(
          attempt, [&] { return sig != 0 || (sig = take_signal(sig_fd)) != 0; }, round);
      if (joined == NodeRendezvous::Joined::stopped) {
        std::fprintf(stderr, "zeroth launch: got signal %d while the nodes agreed on start %d; no rank was started\n", sig,
                     attempt + 1);
        outcome = {128 + sig, true, false, fmt::format("signal {} to the launcher", sig)};
        nodes->fail(attempt, outcome.cause, true);
        break;
      }
      if (joined == NodeRendezvous::Joined::late) {
        std::fprintf(stderr, "zeroth launch: node %d came after start %d of the job closed; it takes no part\n", o.node_rank,
                     attempt + 1);
        outcome = {1, false, false, "late"};
        break;
      }
      start.nnodes = static_cast<int>(round.members.size());
      start.node_rank = round.index;
      port = base_port + 1 + attempt;
      ZEROTH_CHECK(port <= 65535, "start {} would put the ranks' store on port {}: give a lower --master-port", attempt + 1, port);
      other_nodes = [&nodes, attempt] { return nodes->failure(attempt); };
      std::fprintf(stderr, "zeroth launch: start %d with node(s) %s: %d rank(s), this node's from rank %d\n", attempt + 1,
                   fmt::format("{}", fmt::join(round.members, ", ")).c_str(), start.nnodes * o.nproc_per_node,
                   start.node_rank * o.nproc_per_node);
    }
    outcome = run_attempt(start, attempt, port, token, sig_fd, previous, handled, other_nodes);
    if (nodes && outcome.code != 0 && !outcome.elsewhere) nodes->fail(attempt, outcome.cause, outcome.signalled);
    if (outcome.code == 0 || outcome.signalled || attempt == o.max_restarts) break;
    std::fprintf(
        stderr, "zeroth launch: restart %d of %d after %s: starting the job again (zeroth train resumes from its latest checkpoint)\n",
        attempt + 1, o.max_restarts, outcome.cause.c_str());
    std::fflush(stderr);
  }
  ::close(sig_fd);
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  return outcome.code;
}

}  // namespace zeroth::tools
