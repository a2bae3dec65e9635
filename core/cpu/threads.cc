// Core sharing between the ranks of one machine.
#include "core/cpu/threads.h"

#include <algorithm>  // std::max
#include <cstdlib>    // std::getenv
#include <string>     // std::string
#include <thread>     // std::thread::hardware_concurrency

#include "core/cpu/gemm.h"     // cpu::set_gemm_threads
#include "core/cpu/kernels.h"  // cpu::set_num_threads
#include "core/env.h"          // env::kNumThreads

namespace zeroth {

int share_cores(int ranks_per_machine) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / std::max(1, ranks_per_machine));
  if (std::getenv(std::string(env::kNumThreads).c_str()) == nullptr) cpu::set_num_threads(share);
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) cpu::set_gemm_threads(share);
  return cpu::num_threads();
}

}  // namespace zeroth
