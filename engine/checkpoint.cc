// Checkpoint save and load over the plan's owned ranges; the ranks agree after every phase that
// can fail on one of them, so an error ends all of them together instead of leaving some in a
// collective.
#include "engine/checkpoint.h"

#include <chrono>      // std::chrono::steady_clock
#include <cstring>     // std::memcpy
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem
#include <thread>      // std::thread

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN

namespace zeroth {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct StateRef {
  StateKind kind;
  std::string name;
};

// fp32 master weights, then the optimizer's arrays.
std::vector<StateRef> engine_states(const Engine& engine) {
  std::vector<StateRef> states{{StateKind::master, "fp32"}};
  const auto& opt = engine.config().optimizer;
  for (int k = 0; k < opt.state_arrays(); ++k)
    states.push_back({k == 0 ? StateKind::moment0 : StateKind::moment1, std::string(opt.state_array_name(k))});
  return states;
}

// A tensor of the engine: a parameter of a block, at [begin, begin + numel) of its flat space.
struct TensorRef {
  std::string name;  // "<block>.<parameter>"
  std::vector<int64_t> shape;
  int block;
  size_t begin, numel;
};

std::vector<TensorRef> plan_tensors(const std::vector<BlockSpec>& specs, const Plan& plan) {
  std::vector<TensorRef> out;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    for (size_t i = 0; i < specs[b].params.size(); ++i) {
      out.push_back({specs[b].name + "." + specs[b].params[i].name, specs[b].params[i].shape, static_cast<int>(b),
                     plan.blocks[b].param_offsets[i], specs[b].params[i].numel()});
    }
  }
  return out;
}

std::vector<BlockSpec> engine_specs(const Engine& engine) {
  std::vector<BlockSpec> specs;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) specs.push_back(engine.block_spec(static_cast<int>(b)));
  return specs;
}

std::vector<TensorRef> engine_tensors(const Engine& engine) { return plan_tensors(engine_specs(engine), engine.plan()); }

// What rank `rank`'s file holds, in file order: per block, per state, the part of each parameter
// inside the rank's slice [rank * shard, (rank + 1) * shard) of the block's padded space.
struct FilePiece {
  int tensor, state;
  uint64_t lo, hi, offset;
};

std::vector<FilePiece> file_layout(const Plan& plan, const std::vector<TensorRef>& tensors, size_t states, int rank) {
  std::vector<FilePiece> out;
  uint64_t offset = 0;
  size_t first = 0;  // the block's first tensor
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const size_t lo = rank * plan.blocks[b].shard, hi = lo + plan.blocks[b].shard;
    size_t end = first;
    while (end < tensors.size() && tensors[end].block == static_cast<int>(b)) ++end;
    for (size_t s = 0; s < states; ++s) {
      for (size_t t = first; t < end; ++t) {
        const size_t a = std::max(lo, tensors[t].begin), e = std::min(hi, tensors[t].begin + tensors[t].numel);
        if (a >= e) continue;
        out.push_back({static_cast<int>(t), static_cast<int>(s), a - tensors[t].begin, e - tensors[t].begin, offset});
        offset += (e - a) * sizeof(float);
      }
    }
    first = end;
  }
  return out;
}

// Every rank's `mine` (the same length on every rank), rank-major: an all-gather of the bytes
// through device memory (gathering moves bytes, so the f32 view changes none).
std::vector<uint64_t> all_gather_words(Engine& engine, const std::vector<uint64_t>& mine) {
  Device& device = engine.device();
  Stream& s = engine.compute_stream();
  const size_t n = mine.size(), dp = static_cast<size_t>(engine.comm().size());
  Buffer send = device.allocate(n * 8, MemTag::other), recv = device.allocate(n * 8 * dp, MemTag::other);
  device.copy(s, send.data(), mine.data(), n * 8);
  engine.comm().all_gather(s, send.view(DType::f32), recv.view(DType::f32));
  std::vector<uint64_t> all(n * dp);
  device.copy(s, all.data(), recv.data(), n * 8 * dp);
  s.synchronize();
  return all;
}

// Runs `work`, keeping its error's text; the ranks then agree, and every rank raises when any
// failed: its own error, or one naming the rank that failed.
class Agreement {
 public:
  explicit Agreement(Engine& engine) : engine_(engine) {}
  template <typename F>
  void attempt(F&& work) {
    if (error_) return;
    try {
      work();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  // `extra` words ride along; returns every rank's, rank-major (extra.size() + 1 per rank). The
  // failing rank raises its own error (and logs it, since a threaded run reports rank 0's).
  std::vector<uint64_t> agree(const char* what, std::vector<uint64_t> extra = {}) {
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

 private:
  Engine& engine_;
  std::exception_ptr error_;
};

// The manifest's tensors and their pieces in every rank's file.
void add_tensors(Manifest& m, const Plan& plan, const std::vector<TensorRef>& tensors) {
  for (const auto& t : tensors) m.tensors.push_back({t.name, t.shape, std::vector<std::vector<CkptPiece>>(m.states.size())});
  for (int r = 0; r < plan.dp; ++r)
    for (const auto& p : file_layout(plan, tensors, m.states.size(), r))
      m.tensors[p.tensor].pieces[p.state].push_back({r, p.offset, p.lo, p.hi});
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// Rank 0's part after the data files: manifest, renames, `latest`, retention.
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

}  // namespace

std::vector<std::string> checkpoint_tensor_names(const Engine& engine) {
  std::vector<std::string> names;
  for (const auto& t : engine_tensors(engine)) names.push_back(t.name);
  return names;
}

struct CheckpointSaver::Pending {
  std::string name, what;
  fs::path dir, tmp;
  int keep_last = 0;
  Manifest header;  // rank 0: all but the files and tensors, as of the save's step
  std::thread writer;
  CkptFile file;
  std::exception_ptr error;  // of this rank's copy or write
  Clock::time_point start;
  double blocked = 0;  // seconds save() held the caller
};

CheckpointSaver::CheckpointSaver(bool async) : async_(async) {}

CheckpointSaver::~CheckpointSaver() {
  // An unpublished save (the run failed before complete()) is dropped; its temporary folder is
  // removed by the next save into the folder.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

namespace {

// This rank's file, piece by piece in file order: sink(values, count).
void for_each_piece(Engine& engine, const std::vector<StateRef>& states, const std::vector<TensorRef>& tensors,
                    const std::function<void(const float*, size_t)>& sink) {
  const Plan& plan = engine.plan();
  std::vector<float> values;
  int block = -1, state = -1;
  for (const auto& p : file_layout(plan, tensors, states.size(), plan.rank)) {
    const auto& t = tensors[p.tensor];
    const OwnedRange& r = plan.range(states[p.state].kind, t.block);
    if (t.block != block || p.state != state) {
      block = t.block, state = p.state;
      values.resize(r.numel());
      engine.read_owned(states[state].kind, block, values);
    }
    ZEROTH_CHECK(t.begin + p.lo >= r.lo && t.begin + p.hi <= r.hi, "the rank's slice lies outside its owned range");
    sink(values.data() + (t.begin + p.lo - r.lo), p.hi - p.lo);
  }
}

offload::IoOptions io_options(const AioConfig& aio) {
  return {.block_size = aio.block_size,
          .queue_depth = static_cast<unsigned>(aio.queue_depth),
          .threads = static_cast<unsigned>(aio.threads)};
}

}  // namespace

CheckpointIo CheckpointSaver::save(Engine& engine, const CheckpointSaveOptions& o) {
  if (pending_) complete(engine);  // one save in flight at a time
  const Plan& plan = engine.plan();
  const int rank = plan.rank;
  auto p = std::make_unique<Pending>();
  p->start = Clock::now();
  p->name = fmt::format("step-{}", engine.steps_run());
  p->dir = o.dir;
  p->tmp = p->dir / (".tmp-" + p->name);
  p->keep_last = o.keep_last;
  p->what = fmt::format("saving the checkpoint {}", (p->dir / p->name).string());
  const auto states = engine_states(engine);
  const auto tensors = engine_tensors(engine);

  Agreement agreement(engine);
  if (rank == 0) {
    agreement.attempt([&] {
      std::error_code ec;
      fs::create_directories(p->dir, ec);
      if (ec)
        ZEROTH_THROW(IoError, "cannot create the checkpoint folder {}: {}; check run.checkpoint_dir", p->dir.string(), ec.message());
      // Leftovers of saves a crash interrupted.
      for (const auto& e : fs::directory_iterator(p->dir, ec))
        if (e.path().filename().string().starts_with(".tmp-step-")) remove_quietly(e.path());
      fs::create_directory(p->tmp, ec);
      if (ec) ZEROTH_THROW(IoError, "cannot create {}: {}", p->tmp.string(), ec.message());
    });
  }
  agreement.agree(p->what.c_str());

  if (rank == 0) {
    Manifest& m = p->header;
    m.step = engine.steps_run();
    m.world = o.world;
    m.world["dp"] = plan.dp;
    if (!m.world.contains("tp")) m.world["tp"] = 1;
    if (!m.world.contains("pp")) m.world["pp"] = 1;
    m.world["zero_stage"] = plan.stage;
    m.world["offload_optimizer"] = offload_device_name(engine.config().zero.offload_optimizer.device);
    m.world["offload_param"] = offload_device_name(engine.config().zero.offload_param.device);
    m.optimizer = std::string(optimizer_name(engine.config().optimizer.kind));
    for (const auto& s : states) m.states.push_back(s.name);
    m.engine = engine.counters();
    m.engine["compute_dtype"] = dtype_name(plan.compute_dtype);
    m.run = o.run;
    m.config = o.config;
  }
  const std::string path = (p->tmp / ckpt_file_name(rank)).string();
  const offload::IoOptions io = io_options(engine.config().aio);
  try {
    if (!async_) {
      CkptFileWriter out(path, io);
      for_each_piece(engine, states, tensors, [&](const float* v, size_t n) { out.write(v, n * sizeof(float)); });
      p->file = out.finish();
    } else {
      // The copy the writer works from, so training may change the state meanwhile.
      size_t total = 0;
      for (const auto& piece : file_layout(plan, tensors, states.size(), rank)) total += piece.hi - piece.lo;
      snapshot_.resize(total);
      size_t at = 0;
      for_each_piece(engine, states, tensors, [&](const float* v, size_t n) {
        std::memcpy(snapshot_.data() + at, v, n * sizeof(float));
        at += n;
      });
      p->writer = std::thread([this, pending = p.get(), path, io] {
        try {
          CkptFileWriter out(path, io);
          out.write(snapshot_.data(), snapshot_.size() * sizeof(float));
          pending->file = out.finish();
        } catch (...) {
          pending->error = std::current_exception();
        }
      });
    }
  } catch (...) {
    p->error = std::current_exception();
  }
  engine.release_transfer_buffers();
  p->blocked = std::chrono::duration<double>(Clock::now() - p->start).count();
  pending_ = std::move(p);
  if (!async_) return complete(engine);
  return {(pending_->dir / pending_->name).string(), 0, 0, 0, pending_->blocked};
}

CheckpointIo CheckpointSaver::complete(Engine& engine) {
  ZEROTH_CHECK(pending_ != nullptr, "CheckpointSaver::complete() without a save in flight");
  const auto t0 = Clock::now();
  const std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  const Plan& plan = engine.plan();
  const int rank = plan.rank, dp = plan.dp;
  CheckpointIo io{(p->dir / p->name).string()};
  Agreement agreement(engine);
  agreement.attempt([&] {
    if (p->error) std::rethrow_exception(p->error);
  });
  std::vector<uint64_t> all;
  try {
    all = agreement.agree(p->what.c_str(), {p->file.bytes, p->file.xxh3});
  } catch (...) {
    if (rank == 0) remove_quietly(p->tmp);
    throw;
  }
  io.bytes = p->file.bytes;
  for (int r = 0; r < dp; ++r) io.all_bytes += all[r * 3 + 1];
  if (rank == 0) {
    agreement.attempt([&] {
      Manifest& m = p->header;
      for (int r = 0; r < dp; ++r) m.files.push_back({ckpt_file_name(r), all[r * 3 + 1], all[r * 3 + 2]});
      add_tensors(m, plan, engine_tensors(engine));
      publish(p->dir, p->name, m, p->keep_last);
    });
    std::error_code ec;
    if (!fs::exists(p->dir / p->name / kManifestName, ec)) remove_quietly(p->tmp);
  }
  agreement.agree(p->what.c_str());
  const auto end = Clock::now();
  io.seconds = std::chrono::duration<double>(end - p->start).count();
  io.blocked_seconds = async_ ? p->blocked + std::chrono::duration<double>(end - t0).count() : io.seconds;
  return io;
}

CheckpointIo save_checkpoint(Engine& engine, const CheckpointSaveOptions& options) {
  return CheckpointSaver(false).save(engine, options);
}

CheckpointIo load_checkpoint(Engine& engine, const std::string& path, Manifest* out, bool weights_only) {
  const auto t0 = Clock::now();
  const Plan& plan = engine.plan();
  const int rank = plan.rank, dp = plan.dp;
  // The same checks on every rank, from the same files; the ranks agree before going on, so a
  // rank that cannot read them (another disk, a file replaced meanwhile) stops them all.
  auto states = engine_states(engine);
  if (weights_only) states.resize(1);
  const auto tensors = engine_tensors(engine);
  std::string step_dir, manifest_path;
  Manifest m;
  std::vector<int> state_at;  // the manifest's index of each engine state
  std::vector<const CkptTensor*> found;
  Agreement early(engine);
  early.attempt([&] {
    step_dir = resolve_checkpoint(path);
    m = read_manifest(step_dir);
    manifest_path = (fs::path(step_dir) / kManifestName).string();
    for (const auto& s : states) {
      const int i = m.state_index(s.name);
      if (i < 0) {
        throw CheckpointError(
            fmt::format("{}: the checkpoint holds no \"{}\" optimizer state ({} wrote it; its states: {}), which this run's "
                        "{} needs; use the same optimizer type, or start from its weights only (run.init_from)",
                        manifest_path, s.name, m.optimizer, fmt::join(m.states, ", "),
                        optimizer_name(engine.config().optimizer.kind)));
      }
      state_at.push_back(i);
    }
    for (const auto& t : tensors) {
      const CkptTensor* c = m.find(t.name);
      if (c == nullptr) {
        throw CheckpointError(
            fmt::format("{}: the checkpoint has no tensor {}; it was written for another model (check model.* in the "
                        "config against the checkpoint's)",
                        manifest_path, t.name));
      }
      if (c->shape != t.shape) {
        throw CheckpointError(
            fmt::format("{}: tensor {} has the shape [{}] in the checkpoint but [{}] in this model; the model.* keys "
                        "differ from the run that wrote it",
                        manifest_path, t.name, fmt::join(c->shape, ", "), fmt::join(t.shape, ", ")));
      }
      found.push_back(c);
    }
    if (m.tensors.size() != tensors.size()) {
      throw CheckpointError(fmt::format("{}: the checkpoint holds {} tensors, this model {}; it was written for another model",
                                        manifest_path, m.tensors.size(), tensors.size()));
    }
  });
  early.agree("loading a checkpoint");
  CheckpointIo io{step_dir};

  // Verification, the files split between the ranks; every rank learns every outcome.
  const size_t files = m.files.size();
  std::vector<uint64_t> checks(2 * files, 0);
  for (size_t f = static_cast<size_t>(rank); f < files; f += static_cast<size_t>(dp)) {
    const FileCheck c = verify_file(step_dir, m.files[f]);
    checks[2 * f] = static_cast<uint64_t>(c.problem), checks[2 * f + 1] = c.found;
    io.bytes += c.read_bytes;
  }
  const auto all = all_gather_words(engine, checks);
  std::string problems;
  for (size_t f = 0; f < files; ++f) {
    const size_t r = f % static_cast<size_t>(dp), at = r * 2 * files + 2 * f;
    const FileCheck c{static_cast<FileCheck::Problem>(all[at]), all[at + 1]};
    if (c.problem != FileCheck::Problem::none) problems += (problems.empty() ? "" : "; ") + c.describe(step_dir, m.files[f]);
  }
  if (!problems.empty())
    throw CheckpointError(problems + "; the checkpoint cannot be loaded (an earlier step folder may still be whole)");

  Agreement agreement(engine);
  agreement.attempt([&] {
    CkptReader reader(step_dir, m);
    std::vector<float> moments;
    size_t first = 0;
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      size_t end = first;
      while (end < tensors.size() && tensors[end].block == static_cast<int>(b)) ++end;
      // Padded elements [lo, hi) of the block's state s.
      auto fill = [&](size_t s, size_t lo, size_t hi, float* values) {
        for (size_t t = first; t < end; ++t) {
          const size_t a = std::max(lo, tensors[t].begin), e = std::min(hi, tensors[t].begin + tensors[t].numel);
          if (a < e) reader.read(*found[t], state_at[s], a - tensors[t].begin, e - tensors[t].begin, values + (a - lo));
        }
      };
      engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) { fill(0, lo, hi, values); });
      for (size_t s = 1; s < states.size(); ++s) {
        const OwnedRange& r = plan.range(states[s].kind, static_cast<int>(b));
        moments.assign(r.numel(), 0.0f);  // reused: its pages are touched once, not per block
        fill(s, r.lo, r.hi, moments.data());
        engine.write_owned(states[s].kind, static_cast<int>(b), moments);
      }
      first = end;
    }
    io.bytes += reader.bytes_read();
    if (!weights_only) engine.restore_counters(m.engine);
  });
  engine.release_transfer_buffers();
  agreement.agree(fmt::format("loading the checkpoint {}", step_dir).c_str());
  io.all_bytes = m.data_bytes();
  io.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (out != nullptr) *out = m;
  return io;
}

CheckpointIo write_checkpoint(const std::vector<BlockSpec>& specs, const Plan& plan, Manifest m, const TensorSource& values,
                              const std::string& dir) {
  const auto t0 = Clock::now();
  const auto tensors = plan_tensors(specs, plan);
  const std::string name = fmt::format("step-{}", m.step);
  const fs::path tmp = fs::path(dir) / (".tmp-" + name);
  CheckpointIo io{(fs::path(dir) / name).string()};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZEROTH_THROW(IoError, "cannot create the checkpoint folder {}: {}", dir, ec.message());
  remove_quietly(tmp);
  fs::create_directory(tmp, ec);
  if (ec) ZEROTH_THROW(IoError, "cannot create {}: {}", tmp.string(), ec.message());
  try {
    m.world["dp"] = plan.dp;
    m.files.clear();
    m.tensors.clear();
    std::vector<float> buffer;
    for (int r = 0; r < plan.dp; ++r) {
      CkptFileWriter out((tmp / ckpt_file_name(r)).string());
      for (const auto& p : file_layout(plan, tensors, m.states.size(), r)) {
        buffer.resize(p.hi - p.lo);
        values(static_cast<size_t>(p.tensor), p.state, p.lo, p.hi, buffer.data());
        out.write(buffer.data(), buffer.size() * sizeof(float));
      }
      m.files.push_back(out.finish());
      io.bytes += m.files.back().bytes;
    }
    io.all_bytes = io.bytes;
    add_tensors(m, plan, tensors);
    publish(dir, name, m, 0);
  } catch (...) {
    std::error_code ec;
    if (!fs::exists(fs::path(io.path) / kManifestName, ec)) remove_quietly(tmp);
    throw;
  }
  io.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return io;
}

}  // namespace zeroth
