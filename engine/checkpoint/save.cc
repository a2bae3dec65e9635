// Checkpoint save (engine/checkpoint/checkpoint.h): each rank's file from its owned ranges, written at once
// or by a thread from a host copy; the ranks agree after every phase that can fail on one of them,
// so an error ends all of them together instead of leaving some in a collective. Also the writing
// of a checkpoint without an engine (import, reshard).
#include "engine/checkpoint/checkpoint.h"

#include <chrono>      // std::chrono::steady_clock
#include <cstring>     // std::memcpy
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <span>        // std::span
#include <thread>      // std::thread

#include <fmt/format.h>  // fmt::format

#include "core/error.h"                      // ZEROTH_THROW
#include "engine/checkpoint/engine_state.h"  // file_layout, Agreement, publish

namespace zeroth::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Saver::Pending {
  std::string name, what;
  fs::path dir, tmp;
  int keep_last = 0;
  Manifest header;  // rank 0: all but the files and tensors, as of the save's step
  std::thread writer;
  FileEntry file;
  std::exception_ptr error;  // of this rank's copy or write
  Clock::time_point start;
  double blocked = 0;  // seconds save() held the caller
};

Saver::Saver(bool async) : async_(async) {}

Saver::~Saver() {
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
  const float* source = nullptr;  // the block's state: in the engine's host memory, or copied out
  int block = -1, state = -1;
  for (const auto& p : file_layout(plan, tensors, states.size(), plan.rank)) {
    const auto& t = tensors[p.tensor];
    const OwnedRange& r = plan.f32_range(states[p.state].kind, t.block);
    if (t.block != block || p.state != state) {
      block = t.block, state = p.state;
      source = engine.owned_in_host(states[state].kind, block);
      if (source == nullptr) {
        values.resize(r.numel());
        engine.read_owned(states[state].kind, block, values);
        source = values.data();
      }
    }
    ZEROTH_CHECK(t.begin + p.lo >= r.lo && t.begin + p.hi <= r.hi, "the rank's slice lies outside its owned range");
    sink(source + (t.begin + p.lo - r.lo), p.hi - p.lo);
  }
}

// The rank's file in `snapshot` (kept from save to save): each block's state read straight into
// its place where the file's part of it starts at the owned range's first element (the rest of the
// range, padding, spills into the next part's place, written next), else through a block-sized
// buffer. Returns the file's bytes; past them the buffer is zero up to the next 4 KiB.
size_t snapshot_file(Engine& engine, const std::vector<StateRef>& states, const std::vector<TensorRef>& tensors,
                     offload::AlignedBuffer& snapshot) {
  const Plan& plan = engine.plan();
  struct Part {
    int block, state;
    size_t at, lo, hi;  // floats into the file; [lo, hi) of the block's padded space
    bool direct = true;
    std::vector<FilePiece> pieces;
  };
  std::vector<Part> parts;
  size_t at = 0, reach = 0;
  for (const auto& p : file_layout(plan, tensors, states.size(), plan.rank)) {
    const auto& t = tensors[p.tensor];
    const size_t lo = t.begin + p.lo, hi = t.begin + p.hi;
    if (parts.empty() || parts.back().block != t.block || parts.back().state != p.state) {
      parts.push_back({t.block, p.state, at, lo, lo, lo == plan.f32_range(states[p.state].kind, t.block).lo, {}});
    }
    Part& part = parts.back();
    part.direct = part.direct && lo == part.hi;
    part.hi = hi;
    part.pieces.push_back(p);
    at += p.hi - p.lo;
  }
  for (const auto& part : parts) {
    const size_t range = plan.f32_range(states[part.state].kind, part.block).numel();
    reach = std::max(reach, part.direct ? part.at + range : part.at + (part.hi - part.lo));
  }
  const size_t bytes = at * sizeof(float);
  const size_t need = (std::max(reach, at) * sizeof(float) + offload::kIoAlignment - 1) / offload::kIoAlignment *
                      offload::kIoAlignment;
  if (snapshot.size() < need) snapshot = offload::AlignedBuffer(need);
  auto* out = reinterpret_cast<float*>(snapshot.data());
  std::vector<float> values;
  for (const auto& part : parts) {
    const StateKind kind = states[part.state].kind;
    const OwnedRange& r = plan.f32_range(kind, part.block);
    if (part.direct) {
      engine.read_owned(kind, part.block, std::span<float>(out + part.at, r.numel()));
      continue;
    }
    values.resize(r.numel());
    engine.read_owned(kind, part.block, values);
    size_t into = part.at;
    for (const auto& p : part.pieces) {
      const auto& t = tensors[p.tensor];
      std::memcpy(out + into, values.data() + (t.begin + p.lo - r.lo), (p.hi - p.lo) * sizeof(float));
      into += p.hi - p.lo;
    }
  }
  std::memset(snapshot.data() + bytes, 0, need - bytes);
  return bytes;
}

}  // namespace

IoStats Saver::save(Engine& engine, const SaveOptions& o) {
  if (pending_) complete(engine);  // one save in flight at a time
  const Plan& plan = engine.plan();
  const int rank = file_index(engine);  // 0: the rank that prepares and publishes the folder
  auto p = std::make_unique<Pending>();
  p->start = Clock::now();
  p->name = fmt::format("step-{}", engine.steps_run());
  p->dir = o.dir;
  p->tmp = p->dir / (".tmp-" + p->name);
  p->keep_last = o.keep_last;
  p->what = fmt::format("saving the checkpoint {}", (p->dir / p->name).string());
  const auto states = engine_states(engine);
  const auto tensors = saved_tensors(engine);

  Agreement agreement(engine);
  if (rank == 0) agreement.attempt([&] { prepare_folder(p->dir, p->tmp); });
  agreement.agree(p->what.c_str());

  if (rank == 0) {
    Manifest& m = p->header;
    m.step = engine.steps_run();
    m.world = o.world;
    m.world["dp"] = plan.dp;
    m.world["tp"] = engine.tensor_ranks();
    m.world["pp"] = engine.pipeline_stages();
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
  const std::string path = (p->tmp / file_name(rank)).string();
  const offload::IoOptions io = io_options(engine.config().aio);
  try {
    if (!async_) {
      FileWriter out(path, io);
      for_each_piece(engine, states, tensors, [&](const float* v, size_t n) { out.write(v, n * sizeof(float)); });
      p->file = out.finish();
    } else {
      // The copy the writer works from, so training may change the state meanwhile; written in place.
      const size_t bytes = snapshot_file(engine, states, tensors, snapshot_);
      p->writer = std::thread([this, pending = p.get(), path, io, bytes] {
        try {
          FileWriter out(path, io);
          out.write_in_place(snapshot_.data(), bytes);
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
  IoStats started;
  started.path = (pending_->dir / pending_->name).string();
  started.blocked_seconds = pending_->blocked;
  return started;
}

// Long: the end of a save in its collective order (join the writer, agree on the files, write and merge the part files,
// publish); every rank must make the same agree() calls in turn, which one function keeps in step.
IoStats Saver::complete(Engine& engine) {
  ZEROTH_CHECK(pending_ != nullptr, "Saver::complete() without a save in flight");
  const auto t0 = Clock::now();
  const std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  const Plan& plan = engine.plan();
  const int rank = file_index(engine), files = file_count(engine), stage = engine.pipeline_stage();
  const int tp = engine.tensor_ranks(), tp_rank = engine.tensor_rank();
  const bool parts = engine.pipeline_stages() > 1 || tp > 1 || plan.ep > 1;
  const int ep = plan.ep;
  IoStats io;
  io.path = (p->dir / p->name).string();
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
  for (int r = 0; r < files; ++r) io.all_bytes += all[r * 3 + 1];
  // A pipeline's stages, the tensor-parallel ranks and the slices of the experts each describe their
  // own tensors (their files numbered from (stage x tp + tp rank) x dp), in a part file beside the
  // data that rank 0 merges into the manifest: a tensor-parallel tensor's slices become one
  // tensor's pieces. Slice 0 describes the dense tensors, every slice its experts.
  const auto part_name = [](int s, int t, int e) { return fmt::format("stage-{}-tp-{}-ep-{}.tensors.json", s, t, e); };
  if (parts) {
    if (plan.rank < ep) {
      agreement.attempt([&] {
        Manifest part = p->header;
        part.states.clear();
        for (const auto& st : engine_states(engine)) part.states.push_back(st.name);
        const auto tensors = saved_tensors(engine);
        add_tensors(part, plan, tensors, (stage * tp + tp_rank) * plan.dp);
        // The other slices leave the dense tensors to slice 0 (the files' layout needs them all).
        if (plan.rank > 0) {
          decltype(part.tensors) experts;
          for (size_t i = 0; i < tensors.size(); ++i)
            if (plan.blocks[tensors[i].block].expert) experts.push_back(std::move(part.tensors[i]));
          part.tensors = std::move(experts);
        }
        const nlohmann::json whole = part.to_json();
        write_file_atomically(p->tmp.string(), part_name(stage, tp_rank, plan.rank), whole.at("tensors").dump() + "\n");
      });
    }
    agreement.agree(p->what.c_str());
  }
  if (rank == 0) {
    agreement.attempt([&] {
      Manifest& m = p->header;
      for (int r = 0; r < files; ++r) m.files.push_back({file_name(r), all[r * 3 + 1], all[r * 3 + 2]});
      if (!parts) {
        add_tensors(m, plan, saved_tensors(engine));
      } else {
        nlohmann::json j = m.to_json();
        std::map<std::string, size_t> index;  // tensor name -> its entry
        for (int s = 0; s < engine.pipeline_stages(); ++s) {
          for (int t = 0; t < tp * ep; ++t) {
            const fs::path part = p->tmp / part_name(s, t / ep, t % ep);
            for (const auto& tensor : read_json_file(part.string())) {
              const std::string name = tensor.at("name").get<std::string>();
              if (!index.contains(name)) {
                index[name] = j["tensors"].size();
                j["tensors"].push_back(tensor);
                continue;
              }
              auto& into = j["tensors"][index[name]];
              for (const auto& state : m.states) {
                for (const auto& piece : tensor.at(state)) into[state].push_back(piece);
              }
            }
            fs::remove(part);
          }
        }
        m = Manifest::from_json(j, (p->tmp / kManifestName).string());
      }
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

IoStats save(Engine& engine, const SaveOptions& options) { return Saver(false).save(engine, options); }

IoStats write(const std::vector<BlockSpec>& specs, const Plan& plan, Manifest m, const TensorSource& values, const std::string& dir) {
  const auto t0 = Clock::now();
  const auto tensors = plan_tensors(specs, plan);
  const std::string name = fmt::format("step-{}", m.step);
  const fs::path tmp = fs::path(dir) / (".tmp-" + name);
  IoStats io;
  io.path = (fs::path(dir) / name).string();
  prepare_folder(dir, tmp);
  try {
    m.world["dp"] = plan.dp;
    m.world["tp"] = 1;  // whole tensors
    m.files.clear();
    m.tensors.clear();
    std::vector<float> buffer;
    for (int r = 0; r < plan.dp; ++r) {
      FileWriter out((tmp / file_name(r)).string());
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

}  // namespace zeroth::ckpt
