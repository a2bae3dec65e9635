// Child processes for the tools: `zeroth launch`'s ranks and the references the benchmarks run
// beside zeroth (fio, PyTorch). One way to start a program without a shell, its output on pipes.
#pragma once

#include <signal.h>     // sigset_t
#include <sys/types.h>  // pid_t

#include <map>     // std::map
#include <string>  // std::string
#include <vector>  // std::vector

namespace zeroth::tools {

struct SpawnOptions {
  std::map<std::string, std::string> env;  // set in the child's environment (the rest inherited)
  bool new_group = false;                  // its own process group: a signal to the group reaches all it starts
  bool die_with_parent = false;            // SIGKILL when the calling thread ends (PR_SET_PDEATHSIG)
  const sigset_t* mask = nullptr;          // the child's signal mask (null: this thread's)
  const sigset_t* defaults = nullptr;      // signals whose handling the child resets to the default
};

struct Child {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;  // read ends of the child's stdout and stderr (close-on-exec)
};

// Starts argv (argv[0] looked up on PATH when it has no '/'). IoError "cannot start 'argv[0]':
// why" when it cannot be run; nothing is left behind then.
Child spawn_child(const std::vector<std::string>& argv, const SpawnOptions& options = {});

// The environment of this process with `overrides` set, as "KEY=value" entries; without
// OMP_WAIT_POLICY where it is zeroth's default (core/cpu/openmp_wait.h).
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides);

struct ProcessResult {
  int status = 0;  // exit code, 128 + signal when killed
  std::string out, err;
};

// Runs argv to its end and returns what it wrote. The child dies with the calling thread (the
// tools call it from their main thread, so with zeroth), however that ends.
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
// For a signal handler: SIGKILLs the child run_process is waiting on, if any, and reaps it, so
// nothing the child does (fio laying a file out again) comes after the handler's cleanup.
// Async-signal-safe.
void kill_running_child();

// The exit code of a waitpid status: the code, or 128 + the signal that killed it.
int exit_code(int wait_status);

}  // namespace zeroth::tools
