// The box a run starts with: the resolved config in rows (model, data, parallel, batch, optimizer,
// schedule, memory, checkpoints...), as rank 0 prints them and metrics.jsonl keeps them.
#pragma once

#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "engine/plan/plan.h"  // Plan
#include "train/trainer.h"     // TrainConfig, RunFacts

namespace zeroth::tools {

// The rows; `peak_how` says what MFU is taken against.
std::vector<std::pair<std::string, std::string>> box_rows(const TrainConfig& c, const Plan& plan, const RunFacts& f,
                                                          const std::string& peak_how);
// What each tensor-parallel rank holds and the model's collectives per layer.
std::string tensor_line(const TrainConfig& c);
// A count with its SI prefix: "3.30M", "16.1k".
std::string si(double v);

}  // namespace zeroth::tools
