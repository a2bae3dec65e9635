// zeroth plan's plans as JSON and as a table (plan_command.cc prints the rest).
#pragma once

#include <cstdint>  // uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "planner/planner.h"  // Candidate, Layout

namespace zeroth::tools::plan_tables {

// "-", or where the optimizer state and parameters live ("opt:cpu par:nvme").
std::string placement(const Layout& l);
nlohmann::json plan_json(const Candidate& c);
// One row a plan, fastest first; the expert-parallel column with `experts`, Ulysses' with `sequence`.
void print_table(const std::vector<Candidate>& plans, uint64_t gpus_per_node, bool experts, bool sequence);

}  // namespace zeroth::tools::plan_tables
