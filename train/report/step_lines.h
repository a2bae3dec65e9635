// What `zeroth train` prints under a step line.
#pragma once

#include <string>  // std::string

#include "train/trainer.h"  // StepMetrics

namespace zeroth::tools {

// DeepSpeed's wall_clock_breakdown line of a step, ending in a newline: forward, backward, the
// wait for the reductions and the optimizer phase, what became of the sub-groups updated during
// the backward pass, and the swap traffic when there is any.
std::string wall_clock_line(const StepMetrics& s);

}  // namespace zeroth::tools
