// zeroth plan's plans as JSON and as a table.
#include "tools/cli/plan_tables.h"

#include <cstdio>  // std::printf
#include <string>  // std::string

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/memory.h"  // format_bytes

namespace zeroth::tools::plan_tables {

std::string placement(const Layout& l) {
  if (l.offload_optimizer == OffloadDevice::none) return "-";
  std::string out = fmt::format("opt:{}", offload_device_name(l.offload_optimizer));
  if (l.offload_param != OffloadDevice::none) out += fmt::format(" par:{}", offload_device_name(l.offload_param));
  return out;
}

nlohmann::json plan_json(const Candidate& c) {
  const Layout& l = c.layout;
  const StepCost& k = c.cost;
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"ep", l.ep},
          {"micro_batch", l.micro_batch},
          {"micro_batches", l.micro_batches},
          {"stage", l.stage},
          {"offload_optimizer", offload_device_name(l.offload_optimizer)},
          {"offload_param", offload_device_name(l.offload_param)},
          {"checkpointing", checkpointing_name(l.checkpointing)},
          {"sequence_parallel", l.sequence_parallel},
          {"sequence", l.sq},
          {"context", l.cp},
          {"tiled_mlp", l.tiled_mlp},
          {"host_checkpoints", l.host_checkpoints && l.checkpointing == Checkpointing::full},
          {"schedule", l.pp > 1 ? nlohmann::json(pipe_kind_name(l.schedule)) : nlohmann::json(nullptr)},
          {"device_bytes", c.memory.device},
          {"model_states_bytes", c.memory.model_states},
          {"activations_bytes", c.memory.activations},
          {"buffers_bytes", c.memory.buffers},
          {"allowance_bytes", c.memory.allowance},
          {"host_bytes_per_gpu", c.memory.host},
          {"nvme_bytes_per_gpu", c.memory.nvme},
          {"step_s", k.step},
          {"tokens_per_s", k.tokens_per_s},
          {"mfu", k.mfu},
          {"bound", k.bound},
          {"parts_s",
           {{"compute", k.compute},
            {"bubble", k.bubble},
            {"tensor", k.tensor},
            {"pipeline", k.pipeline},
            {"experts", k.experts},
            {"sequence", k.sequence},
            {"data", k.data},
            {"offload", k.offload},
            {"optimizer", k.optimizer}}}};
}

void print_table(const std::vector<Candidate>& plans, uint64_t gpus_per_node, bool experts, bool sequence) {
  std::printf("%3s %5s %3s %4s%s%s %9s %5s %-17s %-9s %-3s %11s %11s %9s %10s %6s  %s\n", "#", "dp", "tp", "pp",
              experts ? "   ep" : "", sequence ? "   sq tile host" : "", "mb x m", "stage", "offload", "recompute", "sp", "device/GPU",
              "host/node", "step s", "tokens/s", "MFU", "bound");
  for (size_t i = 0; i < plans.size(); ++i) {
    const Candidate& c = plans[i];
    const Layout& l = c.layout;
    const std::string ep = experts ? fmt::format(" {:4}", l.ep) : "";
    // The sample group: Ulysses' size, or the ring's as "C" and its size.
    const std::string group = l.cp > 1 ? fmt::format("C{}", l.cp) : fmt::format("{}", l.sq);
    const std::string sq = sequence ? fmt::format(" {:>4} {:>4} {:>4}", group, l.tiled_mlp ? "yes" : "-",
                                                  l.host_checkpoints && l.checkpointing == Checkpointing::full ? "yes" : "-")
                                    : "";
    std::printf("%3zu %5llu %3llu %4llu%s%s %9s %5d %-17s %-9s %-3s %11s %11s %9.3f %10.0f %5.1f%%  %s\n", i + 1,
                static_cast<unsigned long long>(l.dp), static_cast<unsigned long long>(l.tp), static_cast<unsigned long long>(l.pp),
                ep.c_str(), sq.c_str(), fmt::format("{}x{}", l.micro_batch, l.micro_batches).c_str(), l.stage, placement(l).c_str(),
                (std::string(checkpointing_name(l.checkpointing)) + (l.checkpointing == Checkpointing::selective ? "*" : "")).c_str(),
                l.sequence_parallel ? "yes" : "-", format_bytes(c.memory.device).c_str(),
                format_bytes(c.memory.host * gpus_per_node).c_str(), c.cost.step, c.cost.tokens_per_s, 100 * c.cost.mfu,
                c.cost.bound.c_str());
  }
}

}  // namespace zeroth::tools::plan_tables
