// The shared pieces of checkpoint save and load (engine/checkpoint/engine_state.h).
#include "engine/checkpoint/engine_state.h"

#include <algorithm>   // std::sort, std::max
#include <filesystem>  // std::filesystem

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_ERROR

namespace zeroth::ckpt {
namespace fs = std::filesystem;

std::vector<StateRef> engine_states(const Engine& engine) {
  std::vector<StateRef> states{{StateKind::master, "fp32"}};
  const auto& opt = engine.config().optimizer;
  for (int k = 0; k < opt.state_arrays(); ++k)
    states.push_back({k == 0 ? StateKind::moment0 : StateKind::moment1, std::string(opt.state_array_name(k))});
  return states;
}

std::vector<TensorRef> plan_tensors(const std::vector<BlockSpec>& specs, const Plan& plan) {
  std::vector<TensorRef> out;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    for (size_t i = 0; i < specs[b].params.size(); ++i) {
      const ParamSpec& p = specs[b].params[i];
      TensorSplit split = p.tp.split() ? p.tp : TensorSplit{};
      out.push_back({specs[b].name + "." + p.name, p.tp.split() ? p.tp.full_shape : p.shape, static_cast<int>(b),
                     plan.blocks[b].param_offsets[i], p.numel(), std::move(split)});
    }
  }
  return out;
}

namespace {

std::vector<BlockSpec> engine_specs(const Engine& engine) {
  std::vector<BlockSpec> specs;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) specs.push_back(engine.block_spec(static_cast<int>(b)));
  return specs;
}

}  // namespace

std::vector<TensorRef> engine_tensors(const Engine& engine) { return plan_tensors(engine_specs(engine), engine.plan()); }

std::vector<FilePiece> file_layout(const Plan& plan, const std::vector<TensorRef>& tensors, size_t states, int rank) {
  std::vector<FilePiece> out;
  uint64_t offset = 0;
  size_t first = 0;  // the block's first tensor
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const auto& blk = plan.blocks[b];
    // An expert block is this plan's slice of the experts, in the files of the ranks holding it (each
    // with its place in their group); the other ranks' files hold their slices there, which have the
    // same shapes: the bytes are skipped.
    const bool held = plan.holds_my_slice(static_cast<int>(b), rank);
    const size_t lo = static_cast<size_t>(plan.group_rank(static_cast<int>(b), rank)) * blk.shard, hi = lo + blk.shard;
    size_t end = first;
    while (end < tensors.size() && tensors[end].block == static_cast<int>(b)) ++end;
    // A frozen block saves its weights only.
    for (size_t s = 0; s < (blk.frozen ? 1 : states); ++s) {
      for (size_t t = first; t < end; ++t) {
        const size_t a = std::max(lo, tensors[t].begin), e = std::min(hi, tensors[t].begin + tensors[t].numel);
        if (a >= e) continue;
        if (held) out.push_back({static_cast<int>(t), static_cast<int>(s), a - tensors[t].begin, e - tensors[t].begin, offset});
        offset += (e - a) * sizeof(float);
      }
    }
    first = end;
  }
  return out;
}

int file_index(const Engine& engine) {
  return (engine.pipeline_stage() * engine.tensor_ranks() + engine.tensor_rank()) * engine.plan().dp + engine.plan().rank;
}
int file_count(const Engine& engine) { return engine.pipeline_stages() * engine.tensor_ranks() * engine.plan().dp; }

std::vector<TensorRef> saved_tensors(const Engine& engine) {
  auto tensors = engine_tensors(engine);
  const Plan& plan = engine.plan();
  if (plan.tied_block >= 0 && !plan.tied_in_norm)
    std::erase_if(tensors, [&](const TensorRef& t) { return t.block == plan.tied_block; });
  if (engine.tensor_rank() != 0) std::erase_if(tensors, [](const TensorRef& t) { return !t.split.split(); });
  return tensors;
}

namespace {

// The collectives of all_gather_words into `all`, on `s`.
void gather_words(Engine& engine, Stream& s, const std::vector<uint64_t>& mine, Buffer& send, Buffer& recv,
                  std::vector<uint64_t>& all) {
  Device& device = engine.device();
  const size_t n = mine.size(), dp = static_cast<size_t>(engine.comm().size());
  const size_t stages = static_cast<size_t>(engine.pipeline_stages()), tp = static_cast<size_t>(engine.tensor_ranks());
  device.copy(s, send.data(), mine.data(), n * 8);
  // Words travel as pairs of f32 (gathering moves bytes); file_index order: stage, tp rank, dp rank.
  const TensorView all_words = recv.view(DType::f32);
  const TensorView stage = all_words.slice(engine.pipeline_stage() * n * 2 * dp * tp, n * 2 * dp * tp);
  const TensorView group = stage.slice(engine.tensor_rank() * n * 2 * dp, n * 2 * dp);
  engine.comm().all_gather(s, send.view(DType::f32), group);
  if (tp > 1) engine.tensor_comm()->all_gather(s, group, stage);
  if (stages > 1) engine.stage_comm()->all_gather(s, stage, all_words);
  device.copy(s, all.data(), recv.data(), all.size() * 8);
  s.synchronize();
}

}  // namespace

std::vector<uint64_t> all_gather_words(Engine& engine, const std::vector<uint64_t>& mine) {
  Device& device = engine.device();
  Stream& s = engine.compute_stream();
  const size_t n = mine.size(), dp = static_cast<size_t>(engine.comm().size());
  const size_t stages = static_cast<size_t>(engine.pipeline_stages()), tp = static_cast<size_t>(engine.tensor_ranks());
  const size_t ranks = dp * tp * stages;
  Buffer send = device.allocate(n * 8, MemTag::other), recv = device.allocate(n * 8 * ranks, MemTag::other);
  std::vector<uint64_t> all(n * ranks);
  try {
    gather_words(engine, s, mine, send, recv, all);
  } catch (...) {
    // A collective that refuses (a peer failed) leaves the copies already queued: they read
    // `mine` and write `all` and the buffers, which must outlive them.
    try {
      s.synchronize();
    } catch (...) {  // the stream's own error, if any, is the same failure
    }
    throw;
  }
  return all;
}

std::vector<uint64_t> Agreement::agree(const char* what, std::vector<uint64_t> extra) {
  extra.insert(extra.begin(), error_ ? 1 : 0);
  std::vector<uint64_t> all = all_gather_words(engine_, extra);
  const size_t per = extra.size();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      ZLOG_ERROR("{}: {}", what, e.what());
    }
    std::rethrow_exception(error_);
  }
  for (size_t r = 0; r * per < all.size(); ++r) {
    if (all[r * per] != 0) ZEROTH_THROW(IoError, "{}: rank {} failed (its error is in its log); nothing was changed", what, r);
  }
  return all;
}

void add_tensors(Manifest& m, const Plan& plan, const std::vector<TensorRef>& tensors, int first_file) {
  const size_t first = m.tensors.size();
  std::vector<uint64_t> at;  // where the slice's elements go in the tensor's stored order
  for (const auto& t : tensors) {
    m.tensors.push_back({t.name, t.shape, std::vector<std::vector<Piece>>(m.states.size()), t.split, plan.blocks[t.block].frozen});
    m.tensors.back().split.rank = 0;
    m.tensors.back().split.full_shape = t.shape;
    at.push_back(m.tensors.back().part_offset(t.split.rank));
  }
  for (int r = 0; r < plan.dp; ++r)
    for (const auto& p : file_layout(plan, tensors, m.states.size(), r))
      m.tensors[first + p.tensor].pieces[p.state].push_back({first_file + r, p.offset, at[p.tensor] + p.lo, at[p.tensor] + p.hi});
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

void prepare_folder(const fs::path& dir, const fs::path& tmp) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZEROTH_THROW(IoError, "cannot create the checkpoint folder {}: {}; check run.checkpoint_dir", dir.string(), ec.message());
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with(".tmp-step-")) remove_quietly(e.path());
  fs::create_directory(tmp, ec);
  if (ec) ZEROTH_THROW(IoError, "cannot create {}: {}", tmp.string(), ec.message());
}

void publish(const fs::path& dir, const std::string& name, const Manifest& manifest, int keep_last) {
  const fs::path tmp = dir / (".tmp-" + name), final = dir / name;
  write_file_atomically(tmp.string(), kManifestName, manifest.to_json().dump(1) + "\n");
  std::error_code ec;
  // A folder of the same step (a run resumed from an earlier checkpoint) is swapped with the new
  // one in one step (RENAME_EXCHANGE), so `step-N` is never missing, then removed.
  if (fs::exists(final, ec)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) != 0)
      ZEROTH_THROW(IoError, "renameat2({}, {}, RENAME_EXCHANGE) failed: {}", tmp.string(), final.string(), detail::errno_text(errno));
    fsync_dir(dir.string());
    remove_quietly(tmp);
  } else if (::rename(tmp.c_str(), final.c_str()) != 0) {
    ZEROTH_THROW(IoError, "rename({}, {}) failed: {}", tmp.string(), final.string(), detail::errno_text(errno));
  }
  fsync_dir(dir.string());
  write_file_atomically(dir.string(), kLatestName, name + "\n");
  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("step-") || !e.is_directory()) continue;
    try {
      steps.emplace_back(std::stoll(n.substr(5)), e.path());
    } catch (const std::exception&) {
    }
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i >= static_cast<size_t>(keep_last) && steps[i].second != final) remove_quietly(steps[i].second);
  }
}

offload::IoOptions io_options(const AioConfig& aio) {
  return {.block_size = aio.block_size,
          .queue_depth = static_cast<unsigned>(aio.queue_depth),
          .threads = static_cast<unsigned>(aio.threads)};
}

}  // namespace zeroth::ckpt
