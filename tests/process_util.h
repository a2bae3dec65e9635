// Starting and reaping child processes in tests (multi-process backends, the launcher).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace zeroth::testing {

struct Child {
  pid_t pid = -1;
  std::string output_path;
  std::string output() const {
    std::ifstream in(output_path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

// Starts argv with the current environment plus `extra` ("NAME=value", which replaces a variable
// of that name: getenv takes the first), stdout+stderr to a file.
inline Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra, const std::string& output) {
  std::vector<std::string> env_strings;
  auto named = [](const std::string& entry, const std::string& given) {
    const size_t eq = given.find('=');
    return eq != std::string::npos && entry.compare(0, eq + 1, given, 0, eq + 1) == 0;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || named(entry, x);
    if (!replaced) env_strings.push_back(entry);
  }
  for (const auto& x : extra) env_strings.push_back(x);
  std::vector<char*> envp, args;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Child child;
  child.output_path = output;
  const int rc = posix_spawn(&child.pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) child.pid = -1;
  return child;
}

// Waits up to `timeout` for the child; returns its exit status (128+signal when killed), or -1
// on timeout (the child is then killed).
inline int wait_exit(const Child& child, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A TCP port that was free a moment ago.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace zeroth::testing
