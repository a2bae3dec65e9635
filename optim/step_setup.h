// What a step computes once before any kernel runs, shared by the CPU and CUDA paths.
#pragma once

#include "optim/step_constants.h"  // Kind, StepConstants
#include "optim/optimizer.h"

namespace zeroth::optim {

Kind kind_of(const OptimizerParams& params);
// Derived constants in double, rounded to f32 once.
StepConstants make_constants(const OptimizerParams& params, const OptimizerStep& step);
// Argument checks shared by every device.
void check_step(const OptimizerParams& params, const OptimizerStep& step);

}  // namespace zeroth::optim
