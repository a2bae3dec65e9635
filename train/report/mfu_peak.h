// The peak model FLOP/s a CPU run's MFU is measured against, measured once per machine.
#pragma once

#include <string>  // std::string

#include "train/config/train_config.h"  // TrainConfig

namespace zeroth::tools {

struct Peak {
  double flops = 0;  // 0: no peak (MFU is left out)
  std::string how;   // what it is and where it came from, for the start box
};

// The GEMM of the run's products (1024^3; bf16 where a bf16 run's products are, else f32) on one
// core, times the cores this process may run on, times the hosts the launcher says the job spans.
// One core's rate swings by a factor of up to 1.8 from run to run on a shared machine, which would
// move MFU at equal tokens/s: it is measured once per CPU, library and dtype (the best of three
// measurements) and kept in the user's cache ($XDG_CACHE_HOME or ~/.cache, zeroth/mfu-peak.json;
// delete it to measure again).
Peak measure_peak(const TrainConfig& c);

}  // namespace zeroth::tools
