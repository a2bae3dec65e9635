// oneDNN runs the CPU's products on libgomp's threads, which by default spin after each product on
// the cores oneTBB's workers need next: a profile of the bf16 step put 10% of its samples in that
// loop, and with the threads told to sleep (OMP_WAIT_POLICY=PASSIVE) the gpt2-124m step ran 4-8%
// faster (docs/PERFORMANCE.md). libgomp reads the policy once, in its initializer, and until
// libc's own initializer runs the environment cannot be changed for it. So the executable's
// .preinit_array, which runs before every library's initializer, executes zeroth again with the
// policy added: the loader's work twice (a few milliseconds), no constructor yet run. A policy
// already in the environment (ACTIVE, to keep spinning) is kept, and where the exec fails zeroth
// runs on as it was started.
#include "tools/openmp_wait.h"

#include <unistd.h>  // execve

#include <alloca.h>  // alloca
#include <cstdlib>   // std::getenv
#include <cstring>   // std::strlen, std::strncmp, std::strcmp

namespace zeroth::tools {
namespace {

constexpr char kPolicy[] = "OMP_WAIT_POLICY=PASSIVE";
// Marks the policy as zeroth's own, for openmp_wait_defaulted.
constexpr char kMark[] = "ZEROTH_OMP_WAIT_DEFAULT=1";

bool has(char** envp, const char* key) {
  const size_t n = std::strlen(key);
  for (char** e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, key, n) == 0 && (*e)[n] == '=') return true;
  }
  return false;
}

// Called with the process's own argv and envp (environ is not set yet): no allocation, nothing
// but system calls.
void default_openmp_wait(int /*argc*/, char** argv, char** envp) {
  if (envp == nullptr || has(envp, "OMP_WAIT_POLICY")) return;
  size_t n = 0;
  while (envp[n] != nullptr) ++n;
  auto** env = static_cast<char**>(alloca((n + 3) * sizeof(char*)));
  for (size_t i = 0; i < n; ++i) env[i] = envp[i];
  env[n] = const_cast<char*>(kPolicy);
  env[n + 1] = const_cast<char*>(kMark);
  env[n + 2] = nullptr;
  ::execve("/proc/self/exe", argv, env);  // returns only on failure: run on without it
}

[[gnu::section(".preinit_array"), gnu::used]] void (*const kDefaultOpenmpWait)(int, char**, char**) = &default_openmp_wait;

}  // namespace

bool openmp_wait_defaulted() {
  const char* mark = std::getenv("ZEROTH_OMP_WAIT_DEFAULT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return mark != nullptr && policy != nullptr && std::strcmp(policy, "PASSIVE") == 0;
}

}  // namespace zeroth::tools
