// oneDNN runs the CPU's products on libgomp's threads, which by default spin after each product on
// the cores oneTBB's workers need next: a profile of the bf16 step put 10% of its samples in that
// loop, and with the threads told to sleep (OMP_WAIT_POLICY=PASSIVE) the gpt2-124m step ran 4-8%
// faster (docs/PERFORMANCE.md). libgomp reads the policy once, in its initializer, and until
// libc's own initializer runs the environment cannot be changed for it. So the executable's
// .preinit_array, which runs before every library's initializer, executes zeroth again with the
// policy added: the loader's work twice (a few milliseconds), no constructor yet run. A policy
// already in the environment (ACTIVE, to keep spinning) is kept, and where the exec fails zeroth
// runs on as it was started.
#include "core/cpu/openmp_wait.h"

#include <unistd.h>  // execve, readlink

#include <alloca.h>  // alloca
#include <cstdlib>   // std::getenv
#include <cstring>   // std::strcmp

namespace zeroth::cpu {
namespace {

constexpr char kPolicy[] = "OMP_WAIT_POLICY=PASSIVE";
// Marks the policy as zeroth's own, for openmp_wait_defaulted.
constexpr char kMark[] = "ZEROTH_OMP_WAIT_DEFAULT=1";

// Runs before the sanitizers' runtimes may be up: no instrumented code, no library calls but
// readlink and execve.
#define ZEROTH_BEFORE_LIBRARIES [[gnu::no_sanitize("address", "undefined", "thread")]]

// Whether s begins with prefix, and then, if `then` is not 0, that character.
ZEROTH_BEFORE_LIBRARIES bool starts(const char* s, const char* prefix, char then) {
  for (; *prefix != 0; ++s, ++prefix) {
    if (*s != *prefix) return false;
  }
  return then == 0 || *s == then;
}

ZEROTH_BEFORE_LIBRARIES bool contains(const char* s, const char* part) {
  for (; *s != 0; ++s) {
    if (starts(s, part, 0)) return true;
  }
  return false;
}

// The variable's value in envp, or null.
ZEROTH_BEFORE_LIBRARIES const char* value(char** envp, const char* key) {
  for (char** e = envp; *e != nullptr; ++e) {
    if (starts(*e, key, '=')) {
      const char* v = *e;
      while (*v != '=') ++v;
      return v + 1;
    }
  }
  return nullptr;
}

// Called with the process's own argv and envp (environ is not set yet). Not where executing
// /proc/self/exe would run something else: zeroth started by the dynamic loader (`ld.so zeroth`:
// the exe is the loader, and its options would be lost), or under valgrind (the new image would
// escape it).
ZEROTH_BEFORE_LIBRARIES void default_openmp_wait(int /*argc*/, char** argv, char** envp) {
  if (envp == nullptr || value(envp, "OMP_WAIT_POLICY") != nullptr) return;
  const char* preload = value(envp, "LD_PRELOAD");
  if (preload != nullptr && contains(preload, "vgpreload")) return;
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return;
  exe[len] = 0;
  const char* base = exe;
  for (const char* c = exe; *c != 0; ++c) {
    if (*c == '/') base = c + 1;
  }
  if (starts(base, "ld-", 0) || starts(base, "ld.so", 0)) return;
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

}  // namespace zeroth::cpu
