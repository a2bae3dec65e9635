// The plan as text: JSON (ZEROTH_PLAN_JSON, --dry-run), the one-paragraph table logged at start,
// and the program summarized (counts per action kind, the first micro-batch in full).
#include <cerrno>       // errno
#include <cstring>      // std::strerror
#include <fstream>      // std::ofstream
#include <type_traits>  // std::is_same_v
#include <variant>      // std::visit

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/env.h"    // env::kPlanJson
#include "core/error.h"  // ZEROTH_THROW
#include "engine/plan/plan.h"

namespace zeroth {

std::string_view tier_name(Tier tier) {
  constexpr std::string_view kNames[] = {"device", "pinned_host", "host", "nvme"};
  const auto i = static_cast<size_t>(tier);
  return i < kTierCount ? kNames[i] : "invalid";
}

size_t tier_total(const TierBytes& b, Tier tier) {
  size_t n = 0;
  for (size_t v : b[static_cast<size_t>(tier)]) n += v;
  return n;
}

std::string_view state_kind_name(StateKind kind) {
  constexpr std::string_view kNames[] = {"params", "param_shard", "master", "moment0", "moment1", "grad_accum", "grad_shard"};
  const auto i = static_cast<size_t>(kind);
  return i < kStateKindCount ? kNames[i] : "invalid";
}


namespace {

std::string_view pass_name(Pass pass) { return pass == Pass::forward ? "forward" : "backward"; }

nlohmann::json action_json(const Action& a) {
  nlohmann::json j{{"op", action_name(a.kind())}};
  if (a.use >= 0) {
    j["micro"] = a.micro;
    j["block"] = a.block;
    j["pass"] = pass_name(a.pass);
  }
  if (a.kind() != ActionKind::run) j["target"] = action_target(a);
  std::visit(
      [&](const auto& o) {
    using Op = std::decay_t<decltype(o)>;
    if constexpr (requires { o.arena_offset; }) j["offset"] = o.arena_offset;
    if constexpr (requires { o.add; }) j["add"] = o.add;
    // The update's slot is the swap_in's before it.
    if constexpr (requires { o.slot; } && !std::is_same_v<Op, op::Update>) j["slot"] = o.slot;
    if constexpr (std::is_same_v<Op, op::Gather> || std::is_same_v<Op, op::AllReduce> || std::is_same_v<Op, op::ReduceScatter>)
      j["serial"] = a.serial;
    if constexpr (requires { o.sum_over_ranks; }) j["sum_over_ranks"] = o.sum_over_ranks;
    if constexpr (requires { o.over_data_parallel; }) j["sum_over_ranks"] = o.over_data_parallel;
      },
      a.op);
  return j;
}

nlohmann::json actions_json(const std::vector<Action>& actions) {
  auto out = nlohmann::json::array();
  for (const auto& a : actions) out.push_back(action_json(a));
  return out;
}

}  // namespace

int action_target(const Action& a) {
  return std::visit(
      [](const auto& o) {
    if constexpr (requires { o.block; }) return o.block;
    if constexpr (requires { o.bucket; }) return o.bucket;
    if constexpr (requires { o.sub_group; }) return o.sub_group;
    if constexpr (requires { o.buffer; }) return o.buffer;
    return -1;
      },
      a.op);
}

// Long: one key per field of Plan, its lists (blocks, buffers, owned ranges, buckets, sub-groups, passes) as arrays; split,
// the JSON's layout would be spread over several functions.
nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["stage"] = stage;
  j["dp"] = dp;
  j["rank"] = rank;
  j["tp"] = tp;
  j["tp_rank"] = tp_rank;
  j["ep"] = ep;
  j["stages"] = stages;
  j["compute_dtype"] = dtype_name(compute_dtype);
  j["communication_dtype"] = dtype_name(comm_dtype);
  j["micro_batches"] = micro_batches;
  j["max_in_flight"] = max_in_flight;
  j["chunks"] = chunks;
  j["total_numel"] = total_numel;
  j["total_padded"] = total_padded;
  j["shard_numel"] = shard_numel;
  j["trainable_numel"] = trainable_numel;
  j["trainable_shard"] = trainable_shard;
  auto& jb = j["blocks"] = nlohmann::json::array();
  for (const auto& b : blocks) {
    jb.push_back({{"name", b.name},
                  {"numel", b.numel},
                  {"padded", b.padded},
                  {"shard", b.shard},
                  {"shard_offset", b.shard_offset},
                  {"persistent", b.persistent},
                  {"expert", b.expert},
                  {"frozen", b.frozen},
                  {"transient_grads", b.transient_grads},
                  {"reduce_bucket", b.reduce_bucket},
                  {"gather_bucket", b.gather_bucket},
                  {"norm_excluded", b.norm_excluded},
                  {"tp_partial", b.tp_partial}});
  }
  auto& jbuf = j["buffers"] = nlohmann::json::array();
  for (const auto& b : buffers) {
    jbuf.push_back({{"name", b.name},
                    {"tier", tier_name(b.tier)},
                    {"tag", mem_tag_name(b.tag)},
                    {"dtype", dtype_name(b.dtype)},
                    {"numel", b.numel},
                    {"bytes", b.bytes()},
                    {"two_copies", b.two_copies}});
  }
  j["in_backward"] = in_backward;
  j["delayed_update"] = delayed_update;
  j["publish_by_sub_group"] = publish_by_sub_group;
  auto& jo = j["owned"] = nlohmann::json::array();
  for (const auto& o : owned) {
    jo.push_back({{"kind", state_kind_name(o.kind)},
                  {"block", o.block},
                  {"range", {o.lo, o.hi}},
                  {"buffer", o.buffer},
                  {"offset", o.offset},
                  {"tier", tier_name(buffers[o.buffer].tier)}});
  }
  auto buckets = [&](const std::vector<Bucket>& v) {
    auto out = nlohmann::json::array();
    for (const auto& k : v) {
      out.push_back(
          {{"blocks", k.blocks}, {"shard_numel", k.shard_numel}, {"staged", k.staged}, {"from_accumulator", k.from_accumulator}});
    }
    return out;
  };
  j["reduce_buckets"] = buckets(reduce_buckets);
  j["device_buckets"] = device_buckets;  // the leading reduce buckets whose optimizer state stays on the device
  j["gather_buckets"] = buckets(gather_buckets);
  auto& jg = j["sub_groups"] = nlohmann::json::array();
  for (const auto& g : sub_groups) {
    auto spans = nlohmann::json::array();
    for (const auto& s : g) {
      spans.push_back({{"block", s.block}, {"range", {s.lo, s.hi}}, {"decay", s.decay}});
      if (s.tensor >= 0) spans.back()["tensor"] = s.tensor;
    }
    jg.push_back(spans);
  }
  auto& jp = j["passes"] = nlohmann::json::array();
  for (const auto& p : passes) {
    jp.push_back({{"micro", p.micro}, {"pass", pass_name(p.pass)}});
    if (chunks > 1) jp.back()["chunk"] = p.chunk;
  }
  j["actions"] = actions_json(program);
  j["eval_actions"] = actions_json(eval_program);
  j["step_actions"] = actions_json(step_program);
  auto& jm = j["bytes"];
  for (size_t t = 0; t < kTierCount; ++t) {
    if (tier_total(bytes, static_cast<Tier>(t)) == 0 && t != 0) continue;
    auto& jt = jm[std::string(tier_name(static_cast<Tier>(t)))];
    for (size_t g = 0; g < kMemTagCount; ++g) jt[std::string(mem_tag_name(static_cast<MemTag>(g)))] = bytes[t][g];
    jt["total"] = tier_total(bytes, static_cast<Tier>(t));
  }
  return j;
}

void Plan::write_json_if_requested() const {
  const auto path = env::get(env::kPlanJson);
  if (!path) return;
  std::ofstream out(*path);
  out << to_json().dump(1) << "\n";
  out.flush();
  if (!out) ZEROTH_THROW(IoError, "writing the plan to {} (ZEROTH_PLAN_JSON) failed: {}", *path, std::strerror(errno));
}

std::string Plan::group_of(ActionKind kind, int target) const {
  const std::string norm = std::string("dp") + (stages > 1 ? "+pp" : "") + (tp > 1 ? "+tp" : "");
  auto data_parallel = [&](const std::vector<Bucket>* buckets) {
    if (target < 0) return "dp";
    const int block = buckets != nullptr ? buckets->at(target).blocks.front() : target;
    return blocks.at(block).expert ? "edp" : "dp";
  };
  switch (kind) {
    case ActionKind::gather: return data_parallel(nullptr);
    case ActionKind::all_reduce:
    case ActionKind::reduce_scatter: return data_parallel(&reduce_buckets);
    case ActionKind::all_gather: return data_parallel(&gather_buckets);
    case ActionKind::grad_norm: return norm;
    case ActionKind::sum_norms: return tp > 1 ? "dp+tp" : "dp";
    case ActionKind::sum_partial: return "tp";
    default: return "";
  }
}

namespace {

// The table's line on frozen blocks, or "".
std::string frozen_line(const Plan& p) {
  if (p.trainable_numel == p.total_numel) return "";
  size_t frozen = 0;
  for (const auto& b : p.blocks) frozen += b.frozen;
  return fmt::format("  {} frozen block(s), {} parameters: partitioned and gathered, with no gradients, reduction or optimizer "
                     "state; {} parameters train ({} of the shard per rank)\n",
                     frozen, p.total_numel - p.trainable_numel, p.trainable_numel, p.trainable_shard);
}

}  // namespace

// Long: the plan's log lines in the order printed, each a condition and its one line.
std::string Plan::table() const {
  size_t gathers = 0, serial = 0;
  for (const auto& a : program) {
    gathers += a.kind() == ActionKind::gather;
    serial += a.serial;
  }
  std::string out = fmt::format("ZeRO stage {} plan, rank {} of {}: {} blocks, {} parameters ({} padded), shard {} per rank\n", stage,
                                rank, dp, blocks.size(), total_numel, total_padded, shard_numel);
  out += fmt::format("  compute {}, gradient reduction {}, {} reduce bucket(s), {} gather bucket(s), {} gather(s) per cycle of {} "
                     "micro-batch(es); {}\n",
                     dtype_name(compute_dtype), dtype_name(comm_dtype), reduce_buckets.size(), gather_buckets.size(), gathers,
                     micro_batches, serial > 0 ? "communication serialised with compute" : "communication overlapped with compute");
  out += frozen_line(*this);
  size_t partial = 0;
  for (const auto& b : blocks) partial += b.tp_partial.size();
  if (tp > 1) {
    out += fmt::format(
        "  tensor-parallel rank {} of {}: the blocks hold this rank's slices; {} elements of replicated parameters, counted in the "
        "norm on tp rank 0 only{}{}\n",
        tp_rank, tp, tp_replicated, tp_rank == 0 ? " (this one)" : " (left out here)",
        partial > 0
            ? fmt::format("; {} range(s) of partial gradients (sequence parallelism, per-head norms) summed over tp before each "
                          "data-parallel reduction",
                          partial)
            : "");
  }
  size_t expert_numel = 0;
  for (const auto& b : blocks) expert_numel += b.expert ? b.numel : 0;
  const std::string experts =
      ep > 1 ? fmt::format(", expert blocks' ({} parameters of this rank's experts, slice {} of {}) over its expert-data-parallel "
                           "group (edp, {} rank(s))",
                           expert_numel, rank % ep, ep, dp / ep)
             : "";
  out += fmt::format("  groups: gathers and reductions over dp ({} rank(s)){}{}; the global norm over {}\n", dp, experts,
                     partial > 0 ? fmt::format(", partial gradients over tp ({})", tp) : "", group_of(ActionKind::grad_norm));
  const int buckets = static_cast<int>(reduce_buckets.size());
  if (device_buckets > 0 && device_buckets < buckets) {
    out += fmt::format(
        "  optimizer state of {} of {} reduce bucket(s) kept on the device ({} of {} owned elements, {:.1f}%), the rest offloaded\n",
        device_buckets, buckets, device_owned, shard_numel,
        100.0 * static_cast<double>(device_owned) / static_cast<double>(shard_numel));
  }
  int early = 0, at_end = 0, offloaded = 0;
  size_t last_reduction = 0;
  for (size_t i = 0; i < program.size(); ++i)
    if (program[i].kind() == ActionKind::offload_grads) last_reduction = i;
  for (size_t i = 0; i < program.size(); ++i) {
    if (program[i].kind() != ActionKind::update) continue;
    ++early;
    at_end += i > last_reduction;
  }
  for (size_t g = 0; g < sub_groups.size(); ++g) offloaded += sub_group_offloaded(static_cast<int>(g));
  if (early > 0) {
    out += fmt::format(
        "  optimizer: {} of {} offloaded sub-group(s) updated during the backward pass as their reduce buckets complete ({} after "
        "the last one), speculating the step is neither clipped nor skipped; master weights and moments in two copies\n",
        early, offloaded, at_end);
  }
  if (delayed_update) {
    out += fmt::format(
        "  optimizer: delayed update, the {} offloaded sub-group(s) updated in the background under the next step's forward and "
        "backward, which see the weights one update behind; their parameters wait in param_out ({})\n",
        offloaded, format_bytes(buffers[param_out].bytes()));
  }
  if (publish_by_sub_group) {
    out += fmt::format(
        "  optimizer: the {} offloaded sub-group(s) updated after the backward pass in the order the next cycle reads their "
        "blocks, each published on its own: the next forward pass starts beside the rest of the update\n",
        offloaded);
  }
  for (size_t t = 0; t < kTierCount; ++t) {
    const size_t total = tier_total(bytes, static_cast<Tier>(t));
    if (total == 0 && t != 0) continue;
    out += fmt::format("{}  engine state per rank at peak, {} tier:", t == 0 ? "" : "\n", tier_name(static_cast<Tier>(t)));
    for (size_t g = 0; g < kMemTagCount; ++g) {
      if (bytes[t][g] > 0) out += fmt::format(" {} {},", mem_tag_name(static_cast<MemTag>(g)), format_bytes(bytes[t][g]));
    }
    out += fmt::format(" total {}", format_bytes(total));
  }
  return out;
}

std::string Plan::program_summary() const {
  auto counts = [](const std::vector<Action>& actions) {
    size_t n[kActionKindCount] = {};
    for (const auto& a : actions) ++n[a.op.index()];
    std::string text;
    for (size_t k = 0; k < kActionKindCount; ++k) {
      if (n[k] > 0) text += fmt::format("{}{} {}", text.empty() ? "" : ", ", action_name(static_cast<ActionKind>(k)), n[k]);
    }
    return text;
  };
  std::string out = fmt::format("program: {} actions per cycle of {} micro-batch(es), at most {} in flight ({}); {} at the step ({})",
                                program.size(), micro_batches, max_in_flight, counts(program), step_program.size(),
                                counts(step_program));
  out += "\nmicro-batch 0:";
  int use = -1;
  for (const auto& a : program) {
    if (a.micro != 0) continue;
    if (a.use != use) {
      use = a.use;
      out += fmt::format("\n  {} {:<10}", a.pass == Pass::forward ? "F" : "B", blocks[a.block].name);
    }
    const int target = action_target(a);
    const std::string in = group_of(a.kind(), target);
    const std::string group = in.empty() ? "" : fmt::format(" [{}]", in);
    const bool add = a.as<op::ReduceScatter>() ? a.as<op::ReduceScatter>()->add
                                               : a.as<op::OffloadGrads>() && a.as<op::OffloadGrads>()->add;
    if (a.kind() == ActionKind::run) {
      out += " | run |";
    } else if (a.kind() == ActionKind::gather || a.kind() == ActionKind::release || a.kind() == ActionKind::place_grads ||
               a.kind() == ActionKind::accumulate || a.kind() == ActionKind::release_grads) {
      out += fmt::format(" {} {}{}{}", action_name(a.kind()), blocks[target].name, a.serial ? " (serial)" : "", group);
    } else {
      const char* what = a.kind() == ActionKind::update || a.kind() == ActionKind::swap_in || a.kind() == ActionKind::upload ||
                                 a.kind() == ActionKind::swap_out
                             ? "sub-group"
                             : "bucket";
      out += fmt::format(" {} {} {}{}{}{}", action_name(a.kind()), what, target, add ? " (add)" : "", a.serial ? " (serial)" : "",
                         group);
    }
  }
  out += "\nstep:";
  for (const auto& a : step_program) {
    const int target = action_target(a);
    std::string where, slot;
    std::visit(
        [&](const auto& o) {
      using Op = std::decay_t<decltype(o)>;
      if constexpr (requires { o.sub_group; }) where = fmt::format("sub-group {}", o.sub_group);
      if constexpr (requires { o.bucket; }) where = fmt::format("bucket {}", o.bucket);
      if constexpr (requires { o.buffer; }) where = buffers[o.buffer].name;
      if constexpr (requires { o.slot; } && !std::is_same_v<Op, op::Update>) slot = fmt::format(" (slot {})", o.slot);
        },
        a.op);
    const std::string in = group_of(a.kind(), target);
    out += fmt::format(" {} {}{}{},", action_name(a.kind()), where, slot, in.empty() ? "" : fmt::format(" [{}]", in));
  }
  out.pop_back();
  return out;
}

}  // namespace zeroth
