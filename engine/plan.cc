// Building the plan: layout, buckets, and a dry run of one micro-step that places every
// transient buffer, so the executor only replays decisions made here.
#include "engine/plan.h"

#include <algorithm>  // std::max, std::sort
#include <map>        // std::map
#include <numeric>    // std::accumulate
#include <set>        // std::set

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

// Parameters inside a block start on this many elements, so every view is 32-byte aligned in f32.
constexpr size_t kParamAlign = 8;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// First-fit placement on a timeline; its high-water mark is what the arena must hold.
class ArenaSim {
 public:
  explicit ArenaSim(size_t align) : align_(align) {}
  size_t allocate(size_t n) {
    n = round_up(std::max<size_t>(n, 1), align_);
    size_t at = 0;
    for (const auto& [off, len] : used_) {
      if (off >= at + n) break;
      at = std::max(at, off + len);
    }
    used_[at] = n;
    peak_ = std::max(peak_, at + n);
    return at;
  }
  void release(size_t offset) { used_.erase(offset); }
  size_t peak() const { return peak_; }

 private:
  size_t align_;
  std::map<size_t, size_t> used_;
  size_t peak_ = 0;
};

void check_schedule(const BlockSchedule& s, size_t n) {
  std::vector<int> seen_f(n, 0), seen_b(n, 0);
  for (int b : s.forward) {
    if (b < 0 || static_cast<size_t>(b) >= n) ZEROTH_THROW(ConfigError, "block schedule: forward names block {}, but there are {} blocks", b, n);
    ++seen_f[b];
  }
  for (int b : s.backward) {
    if (b < 0 || static_cast<size_t>(b) >= n) ZEROTH_THROW(ConfigError, "block schedule: backward names block {}, but there are {} blocks", b, n);
    ++seen_b[b];
  }
  for (size_t b = 0; b < n; ++b) {
    if (seen_f[b] == 0 || seen_b[b] == 0) {
      ZEROTH_THROW(ConfigError, "block schedule: block {} is never used in the {} pass; every block must be used in both (frozen blocks are not supported)",
                   b, seen_f[b] == 0 ? "forward" : "backward");
    }
  }
}

std::vector<Bucket> make_buckets(const Plan& p, uint64_t limit) {
  std::vector<Bucket> out;
  size_t full = 0;
  for (int b : p.shard_order) {
    const auto& blk = p.blocks[b];
    if (out.empty() || full + blk.padded > limit) {
      out.push_back({{}, blk.shard_offset, 0, blk.full_offset, false});
      full = 0;
    }
    out.back().blocks.push_back(b);
    out.back().shard_numel += blk.shard;
    full += blk.padded;
  }
  return out;
}

}  // namespace

size_t Plan::total_bytes() const { return std::accumulate(bytes.begin(), bytes.end(), size_t{0}); }

Plan make_plan(const std::vector<BlockSpec>& specs, const BlockSchedule& schedule, const EngineConfig& config, int dp,
               int rank) {
  config.validate();
  if (specs.empty()) ZEROTH_THROW(ConfigError, "the model registered no blocks");
  if (dp < 1 || rank < 0 || rank >= dp) ZEROTH_THROW(InvalidArgument, "make_plan: rank {} of {}", rank, dp);
  check_schedule(schedule, specs.size());
  const auto& z = config.zero;
  Plan p;
  p.stage = z.stage;
  p.dp = dp;
  p.rank = rank;
  p.compute_dtype = config.compute_dtype;
  p.comm_dtype = config.communication_dtype;
  p.state_arrays = config.optimizer.state_arrays();
  p.master_aliases_params = config.compute_dtype == DType::f32;

  std::set<std::string> names;
  for (const auto& spec : specs) {
    if (!names.insert(spec.name).second) ZEROTH_THROW(ConfigError, "two blocks are named \"{}\"; block names must be unique", spec.name);
    PlannedBlock blk;
    blk.name = spec.name;
    std::set<std::string> pnames;
    for (const auto& param : spec.params) {
      if (!pnames.insert(param.name).second) ZEROTH_THROW(ConfigError, "block {} has two parameters named \"{}\"", spec.name, param.name);
      blk.numel = round_up(blk.numel, kParamAlign);
      blk.param_offsets.push_back(blk.numel);
      blk.numel += param.numel();
    }
    blk.padded = round_up(std::max<size_t>(blk.numel, 1), static_cast<size_t>(dp) * config.alignment);
    blk.shard = blk.padded / dp;
    blk.persistent = z.stage == 3 && blk.numel <= z.stage3_param_persistence_threshold;
    p.total_numel += blk.numel;
    p.total_padded += blk.padded;
    p.blocks.push_back(std::move(blk));
  }

  // Shard order: by last backward use, so buckets fill in the order gradients complete.
  const size_t nf = schedule.forward.size();
  std::vector<size_t> last_back(specs.size()), first_back(specs.size(), SIZE_MAX);
  for (size_t i = 0; i < schedule.backward.size(); ++i) {
    const int b = schedule.backward[i];
    last_back[b] = i;
    first_back[b] = std::min(first_back[b], i);
  }
  for (size_t b = 0; b < specs.size(); ++b) p.shard_order.push_back(static_cast<int>(b));
  std::sort(p.shard_order.begin(), p.shard_order.end(), [&](int a, int b) { return last_back[a] < last_back[b]; });
  for (int b : p.shard_order) {
    auto& blk = p.blocks[b];
    blk.shard_offset = p.shard_numel;
    blk.full_offset = p.shard_numel * dp;
    p.shard_numel += blk.shard;
    if (blk.persistent) p.persistent_numel += blk.padded;
  }

  const bool transient_grads = z.stage >= 2 || config.compute_dtype != DType::f32;
  const DType grad_source = z.stage <= 1 ? DType::f32 : config.compute_dtype;
  p.reduce_buckets = make_buckets(p, z.reduce_bucket_size);
  for (size_t k = 0; k < p.reduce_buckets.size(); ++k) {
    auto& bucket = p.reduce_buckets[k];
    // Stage 0 all-reduces the contiguous accumulator in place; the others reduce-scatter, which
    // needs a rank-major layout that only a single block has by itself.
    bucket.staged = z.stage == 0 ? config.communication_dtype != DType::f32
                                 : bucket.blocks.size() > 1 || grad_source != config.communication_dtype;
    for (int b : bucket.blocks) p.blocks[b].reduce_bucket = static_cast<int>(k);
    if (bucket.staged) p.reduce_staging = std::max(p.reduce_staging, bucket.shard_numel * dp);
  }
  if (z.stage == 1 || z.stage == 2) {
    p.gather_buckets = make_buckets(p, z.allgather_bucket_size);
    for (size_t k = 0; k < p.gather_buckets.size(); ++k) {
      auto& bucket = p.gather_buckets[k];
      bucket.staged = bucket.blocks.size() > 1;
      for (int b : bucket.blocks) p.blocks[b].gather_bucket = static_cast<int>(k);
      if (bucket.staged) p.gather_staging = std::max(p.gather_staging, bucket.shard_numel * dp);
    }
  }

  // One micro-step, dry run.
  for (int b : schedule.forward) p.uses.emplace_back().block = b;
  for (size_t i = 0; i < schedule.backward.size(); ++i) {
    auto& use = p.uses.emplace_back();
    use.block = schedule.backward[i];
    use.backward = true;
    use.last_backward_use = last_back[use.block] == i;
  }
  ArenaSim params(config.alignment), grads(config.alignment);
  std::map<int, size_t> live, grad_live;  // block -> arena offset
  size_t live_numel = 0;
  // Stages 2-3: a fired bucket's gradient buffers stay placed until the next bucket fires, so
  // the backward writes new gradients while the previous reduction is still on the wire.
  std::vector<int> in_flight;
  const size_t last_use = p.uses.size() - 1;
  auto gather = [&](size_t at, int b) {
    const size_t off = params.allocate(p.blocks[b].padded);
    live[b] = off;
    live_numel += p.blocks[b].padded;
    p.uses[at].gathers.push_back({b, off});
  };
  for (size_t i = 0; i < p.uses.size(); ++i) {
    auto& use = p.uses[i];
    const int b = use.block;
    const auto& blk = p.blocks[b];
    if (z.stage == 3) {
      if (!blk.persistent && !live.contains(b)) gather(i, b);
      // The window ahead holds up to the prefetch bucket of parameters, counting the blocks
      // already gathered for it, so it slides along the schedule instead of growing.
      uint64_t budget = z.stage3_prefetch_bucket_size;
      std::set<int> ahead;
      for (size_t j = i + 1; j < p.uses.size() && budget > 0; ++j) {
        const int c = p.uses[j].block;
        const auto& cb = p.blocks[c];
        if (c == b || cb.persistent || !ahead.insert(c).second) continue;
        if (cb.padded > budget) break;
        budget -= cb.padded;
        if (live.contains(c)) continue;
        if (live_numel + cb.padded > z.stage3_max_live_parameters) break;
        gather(i, c);
      }
    }
    if (use.backward && transient_grads && first_back[b] == i - nf) {
      use.grad_alloc = true;
      use.grad_arena_offset = grads.allocate(blk.padded);
      grad_live[b] = use.grad_arena_offset;
    }
    if (use.last_backward_use) {
      const auto& bucket = p.reduce_buckets[blk.reduce_bucket];
      if (bucket.blocks.back() == b) use.fire_bucket = blk.reduce_bucket;
      if (transient_grads) {
        if (z.stage <= 1) {
          use.grad_releases.push_back(b);
        } else if (use.fire_bucket >= 0) {
          use.grad_releases = std::move(in_flight);
          in_flight = bucket.blocks;
        }
      }
    }
    if (transient_grads && z.stage >= 2 && i == last_use) {
      use.grad_releases.insert(use.grad_releases.end(), in_flight.begin(), in_flight.end());
      in_flight.clear();
    }
    for (int g : use.grad_releases) grads.release(grad_live.at(g));
    if (z.stage == 3 && !blk.persistent) {
      // Keep the block if it is used again soon; "soon" is the parameters touched in between.
      size_t next = i + 1, between = 0;
      while (next < p.uses.size() && p.uses[next].block != b) between += p.blocks[p.uses[next++].block].padded;
      if (next == p.uses.size() || between > z.stage3_max_reuse_distance) {
        use.releases.push_back(b);
        params.release(live.at(b));
        live_numel -= blk.padded;
        live.erase(b);
      }
    }
  }
  p.param_arena = params.peak();
  p.grad_arena = grads.peak();

  const size_t c = dtype_size(config.compute_dtype);
  const size_t owned = z.stage == 0 ? p.total_padded : p.shard_numel;
  auto& bytes = p.bytes;
  bytes[static_cast<size_t>(MemTag::params)] =
      z.stage <= 2 ? p.total_padded * c : (p.shard_numel + p.persistent_numel + p.param_arena) * c;
  bytes[static_cast<size_t>(MemTag::optimizer)] = (p.master_aliases_params ? 0 : owned * 4) + p.state_arrays * owned * 4;
  bytes[static_cast<size_t>(MemTag::grads)] = (z.stage <= 1 ? p.total_padded * 4 : 0) + (z.stage >= 1 ? p.shard_numel * 4 : 0) +
                                              p.grad_arena * c;
  bytes[static_cast<size_t>(MemTag::buffers)] =
      p.reduce_staging * dtype_size(config.communication_dtype) + p.gather_staging * c + sizeof(float);
  return p;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["stage"] = stage;
  j["dp"] = dp;
  j["rank"] = rank;
  j["compute_dtype"] = dtype_name(compute_dtype);
  j["communication_dtype"] = dtype_name(comm_dtype);
  j["total_numel"] = total_numel;
  j["total_padded"] = total_padded;
  j["shard_numel"] = shard_numel;
  j["master_aliases_params"] = master_aliases_params;
  auto& jb = j["blocks"] = nlohmann::json::array();
  for (const auto& b : blocks) {
    jb.push_back({{"name", b.name}, {"numel", b.numel}, {"padded", b.padded}, {"shard", b.shard},
                  {"shard_offset", b.shard_offset}, {"persistent", b.persistent}, {"reduce_bucket", b.reduce_bucket},
                  {"gather_bucket", b.gather_bucket}});
  }
  auto buckets = [&](const std::vector<Bucket>& v) {
    auto out = nlohmann::json::array();
    for (const auto& k : v) out.push_back({{"blocks", k.blocks}, {"shard_numel", k.shard_numel}, {"staged", k.staged}});
    return out;
  };
  j["reduce_buckets"] = buckets(reduce_buckets);
  j["gather_buckets"] = buckets(gather_buckets);
  auto& ju = j["uses"] = nlohmann::json::array();
  for (const auto& u : uses) {
    nlohmann::json e{{"block", u.block}, {"pass", u.backward ? "backward" : "forward"}};
    if (!u.gathers.empty()) {
      auto g = nlohmann::json::array();
      for (const auto& x : u.gathers) g.push_back({x.block, x.arena_offset});
      e["gather"] = g;
    }
    if (!u.releases.empty()) e["release"] = u.releases;
    if (u.fire_bucket >= 0) e["reduce_bucket"] = u.fire_bucket;
    ju.push_back(e);
  }
  j["arena"] = {{"params", param_arena}, {"grads", grad_arena}, {"reduce_staging", reduce_staging},
                {"gather_staging", gather_staging}};
  auto& jm = j["bytes"];
  for (size_t t = 0; t < kMemTagCount; ++t) jm[std::string(mem_tag_name(static_cast<MemTag>(t)))] = bytes[t];
  jm["total"] = total_bytes();
  return j;
}

std::string Plan::table() const {
  size_t gathers = 0;
  for (const auto& u : uses) gathers += u.gathers.size();
  std::string out = fmt::format("ZeRO stage {} plan, rank {} of {}: {} blocks, {} parameters ({} padded), shard {} per rank\n",
                                stage, rank, dp, blocks.size(), total_numel, total_padded, shard_numel);
  out += fmt::format("  compute {}, gradient reduction {}, {} reduce bucket(s), {} gather bucket(s), {} gather(s) per micro-step\n",
                     dtype_name(compute_dtype), dtype_name(comm_dtype), reduce_buckets.size(), gather_buckets.size(), gathers);
  out += "  bytes per rank at peak:";
  for (size_t t = 0; t < kMemTagCount; ++t) {
    if (bytes[t] > 0) out += fmt::format(" {} {},", mem_tag_name(static_cast<MemTag>(t)), format_bytes(bytes[t]));
  }
  out += fmt::format(" total {}", format_bytes(total_bytes()));
  return out;
}

}  // namespace zeroth
