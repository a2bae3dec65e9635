// Starting child processes: fork and exec with the output on pipes, and exec's failure reported
// through a close-on-exec pipe, so "cannot start" is an error here and not an exit code there.
#include "tools/launch/process.h"

#include <fcntl.h>      // O_CLOEXEC
#include <poll.h>       // poll
#include <sys/prctl.h>  // prctl, PR_SET_PDEATHSIG
#include <sys/stat.h>   // stat
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork, execve, pipe2, dup2

#include <atomic>   // std::atomic
#include <cerrno>   // errno
#include <cstdlib>  // std::getenv
#include <string_view>

#include "core/error.h"            // ZEROTH_THROW, SYSCALL_CHECK
#include "core/cpu/openmp_wait.h"  // openmp_wait_defaulted

extern char** environ;

namespace zeroth::tools {
namespace {

// argv[0] as execve needs it: a path, found on PATH in this process (between fork and exec only
// async-signal-safe calls are allowed, and a PATH search allocates).
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  ZEROTH_THROW(IoError, "cannot start '{}': not found on PATH", program);
}

void close_pair(int fds[2]) {
  for (int k = 0; k < 2; ++k)
    if (fds[k] >= 0) ::close(fds[k]);
}

}  // namespace

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    const std::string key = eq == std::string::npos ? entry : entry.substr(0, eq);
    if (overrides.count(key) != 0) continue;
    // zeroth's own default, not the caller's: a zeroth child sets it again, another program
    // (PyTorch beside zeroth) runs as the caller's environment has it.
    if ((key == "OMP_WAIT_POLICY" || key == "ZEROTH_OMP_WAIT_DEFAULT") && cpu::openmp_wait_defaulted()) continue;
    env.push_back(entry);
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

Child spawn_child(const std::vector<std::string>& argv, const SpawnOptions& o) {
  if (argv.empty()) ZEROTH_THROW(InvalidArgument, "spawn_child: no program to start");
  const std::string exe = resolve(argv[0]);
  std::vector<std::string> args = argv, env = environment_with(o.env);
  std::vector<char*> argp, envp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  try {
    SYSCALL_CHECK(::pipe2(out, O_CLOEXEC));
    SYSCALL_CHECK(::pipe2(err, O_CLOEXEC));
    SYSCALL_CHECK(::pipe2(status, O_CLOEXEC));
  } catch (...) {
    close_pair(out), close_pair(err), close_pair(status);
    throw;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec: other threads held locks at the fork.
    int failed = 0;
    if (o.die_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) failed = errno != 0 ? errno : ESRCH;
    if (failed == 0 && o.new_group && ::setpgid(0, 0) != 0) failed = errno;
    if (failed == 0 && o.defaults != nullptr) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig = 1; sig < NSIG; ++sig)
        if (sigismember(o.defaults, sig) == 1) ::sigaction(sig, &dfl, nullptr);
    }
    if (failed == 0 && o.mask != nullptr && ::sigprocmask(SIG_SETMASK, o.mask, nullptr) != 0) failed = errno;
    if (failed == 0 && (::dup2(out[1], 1) < 0 || ::dup2(err[1], 2) < 0)) failed = errno;
    if (failed == 0) {
      ::execve(exe.c_str(), argp.data(), envp.data());
      failed = errno;
    }
    [[maybe_unused]] const ssize_t n = ::write(status[1], &failed, sizeof failed);
    ::_exit(127);
  }
  const int fork_errno = errno;
  // Also here: a signal to the group right after this returns must find it.
  if (pid > 0 && o.new_group) ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  if (pid < 0) {
    ::close(out[0]), ::close(err[0]), ::close(status[0]);
    ZEROTH_THROW(IoError, "cannot start '{}': fork failed: {}", argv[0], detail::errno_text(fork_errno));
  }
  // The status pipe closes at exec (nothing read) or carries exec's errno.
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(status[0], &child_errno, sizeof child_errno)) == -1 && errno == EINTR) {
  }
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int ignored = 0;
    while (::waitpid(pid, &ignored, 0) == -1 && errno == EINTR) {
    }
    ::close(out[0]), ::close(err[0]);
    ZEROTH_THROW(IoError, "cannot start '{}': {}", argv[0], detail::errno_text(child_errno));
  }
  return {pid, out[0], err[0]};
}

int exit_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + (WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0);
}

namespace {
std::atomic<pid_t> g_running_child{-1};  // lock-free, so a signal handler may read it
static_assert(std::atomic<pid_t>::is_always_lock_free);
}  // namespace

void kill_running_child() {
  const pid_t pid = g_running_child.exchange(-1);
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) == -1 && errno == EINTR) {
  }
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  SpawnOptions o;
  o.env = env;
  o.die_with_parent = true;
  const Child child = spawn_child(argv, o);
  g_running_child = child.pid;
  ProcessResult result;
  // Both pipes at once: a child blocked on a full stderr would never close stdout.
  pollfd fds[2] = {{child.out_fd, POLLIN, 0}, {child.err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  for (int open = 2; open > 0;) {
    if (::poll(fds, 2, -1) == -1) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[k].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[k]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[k].fd);
        fds[k].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  // Its pipes are closed: it has finished its work. Taken back before the reaping, so a handler
  // never kills a pid the system has handed to another process.
  int status = 0;
  if (g_running_child.exchange(-1) != child.pid) return {128 + SIGKILL, result.out, result.err};  // a handler reaped it
  while (::waitpid(child.pid, &status, 0) == -1 && errno == EINTR) {
  }
  result.status = exit_code(status);
  return result;
}

}  // namespace zeroth::tools
