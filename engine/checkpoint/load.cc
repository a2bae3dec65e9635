// Checkpoint load (engine/checkpoint/checkpoint.h): the same checks on every rank, the files' verification
// split between the ranks, then each rank's owned elements read from whichever files hold them.
#include "engine/checkpoint/checkpoint.h"

#include <algorithm>   // std::sort, std::is_sorted, std::copy_if, std::lower_bound
#include <iterator>    // std::back_inserter
#include <chrono>      // std::chrono::steady_clock
#include <cstring>     // std::memcpy, std::memset
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <filesystem>  // std::filesystem
#include <span>        // std::span

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"                      // CheckpointError
#include "core/memory.h"                     // available_memory
#include "engine/checkpoint/engine_state.h"  // engine_states, engine_tensors, Agreement

namespace zeroth::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

IoStats load(Engine& engine, const std::string& path, Manifest* out, bool weights_only, const LoadOptions& options) {
  const auto t0 = Clock::now();
  const Plan& plan = engine.plan();
  const int rank = file_index(engine), ranks = file_count(engine);
  // The same checks on every rank, from the same files; the ranks agree before going on, so a
  // rank that cannot read them (another disk, a file replaced meanwhile) stops them all.
  auto states = engine_states(engine);
  if (weights_only) states.resize(1);
  const auto tensors = engine_tensors(engine);
  std::string step_dir, manifest_path;
  Manifest m;
  std::vector<int> state_at;  // the manifest's index of each engine state
  std::vector<const TensorEntry*> found;
  // A pipeline's stages hold the model between them: their tensors together must be the
  // checkpoint's (the tied copy counted once).
  // With expert parallelism a rank holds one slice of the experts: the others hold as many tensors.
  size_t expert_tensors = 0;
  for (const auto& t : tensors) expert_tensors += plan.blocks[t.block].expert ? 1 : 0;
  size_t model_tensors = tensors.size() + (plan.ep - 1) * expert_tensors;
  if (engine.pipeline_stages() > 1) {
    // Tensor-parallel rank 0 of each stage saves all of the stage's tensors (its slices and the
    // replicated ones).
    const auto counts = all_gather_words(engine, {saved_tensors(engine).size() + (plan.ep - 1) * expert_tensors});
    model_tensors = 0;
    for (int s = 0; s < engine.pipeline_stages(); ++s)
      model_tensors += counts[static_cast<size_t>(s) * engine.tensor_ranks() * plan.dp];
  }
  Agreement early(engine);
  early.attempt([&] {
    step_dir = resolve(path);
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
      const TensorEntry* c = m.find(t.name);
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
    if (m.tensors.size() != model_tensors) {
      throw CheckpointError(fmt::format("{}: the checkpoint holds {} tensors, this model {}; it was written for another model",
                                        manifest_path, m.tensors.size(), model_tensors));
    }
  });
  early.agree("loading a checkpoint");
  IoStats io_stats;
  io_stats.path = step_dir;

  // The tensors of each block: [first, end) of `tensors`.
  std::vector<std::pair<size_t, size_t>> block_tensors(plan.blocks.size());
  for (size_t b = 0, first = 0; b < plan.blocks.size(); ++b) {
    size_t end = first;
    while (end < tensors.size() && tensors[end].block == static_cast<int>(b)) ++end;
    block_tensors[b] = {first, end};
    first = end;
  }
  Reader reader(step_dir, m);
  // Padded elements [lo, hi) of block b's state s, read (or recorded) into `values`.
  auto fill = [&](size_t b, size_t s, size_t lo, size_t hi, float* values) {
    for (size_t t = block_tensors[b].first; t < block_tensors[b].second; ++t) {
      const size_t a = std::max(lo, tensors[t].begin), e = std::min(hi, tensors[t].begin + tensors[t].numel);
      if (a < e)
        reader.read_slice(*found[t], state_at[s], tensors[t].split, a - tensors[t].begin, e - tensors[t].begin, values + (a - lo));
    }
  };
  // What the engine takes of each block, as one run of floats: its values [lo, hi), then each
  // optimizer state's owned range.
  struct BlockRun {
    size_t lo = 0, hi = 0;
    std::vector<size_t> at;  // per state: floats into the run
    size_t floats = 0;
  };
  std::vector<BlockRun> runs(plan.blocks.size());
  size_t total_floats = 0, largest = 0;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    BlockRun& r = runs[b];
    const auto [lo, hi] = plan.values_range(static_cast<int>(b));
    r.lo = lo, r.hi = hi;
    for (size_t s = 0; s < states.size(); ++s) {
      r.at.push_back(r.floats);
      r.floats += s == 0 ? r.hi - r.lo : plan.range(states[s].kind, static_cast<int>(b)).numel();
    }
    total_floats += r.floats;
    largest = std::max(largest, r.floats);
  }
  // Direct: per block and state, the engine's own memory the reads land in (nullptr: the block's
  // buffer, then set_block_values or write_owned).
  std::vector<std::vector<float*>> in_place(plan.blocks.size(), std::vector<float*>(states.size(), nullptr));
  auto apply = [&](size_t b, const float* run) {
    const BlockRun& r = runs[b];
    if (in_place[b][0] == nullptr) {
      engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) {
        ZEROTH_CHECK(lo >= r.lo && hi <= r.hi, "block {}: values [{}, {}) asked for, [{}, {}) read", b, lo, hi, r.lo, r.hi);
        std::memcpy(values, run + (lo - r.lo), (hi - lo) * sizeof(float));
      });
    }
    for (size_t s = 1; s < states.size(); ++s) {
      if (in_place[b][s] != nullptr) continue;
      const OwnedRange& o = plan.range(states[s].kind, static_cast<int>(b));
      engine.write_owned(states[s].kind, static_cast<int>(b), std::span<const float>(run + r.at[s], o.numel()));
    }
  };
  // The reads of every block's run, block after block, with the run of block b's state s at
  // base(b, s).
  struct Planned {
    ByteRead read;
    size_t block;
    bool in_place;  // into the engine's memory, not a buffer
  };
  const size_t files = m.files.size();
  auto streams = [&](int f) { return f % ranks == rank; };  // the files this rank verifies
  auto plan_reads = [&](const std::function<float*(size_t, size_t)>& base) {
    std::vector<Planned> planned;
    std::vector<ByteRead> reads;
    reader.record_into(&reads);
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      for (size_t s = 0; s < states.size(); ++s) {
        const OwnedRange* o = s == 0 ? nullptr : &plan.range(states[s].kind, static_cast<int>(b));
        fill(b, s, o ? o->lo : runs[b].lo, o ? o->hi : runs[b].hi, base(b, s));
        for (const auto& r : reads) planned.push_back({r, b, in_place[b][s] != nullptr});
        reads.clear();
      }
    }
    reader.record_into(nullptr);
    // Streamed order: this rank's files one after the other, each from its start.
    std::stable_sort(planned.begin(), planned.end(), [](const Planned& x, const Planned& y) {
      return x.read.file != y.read.file ? x.read.file < y.read.file : x.read.offset < y.read.offset;
    });
    return planned;
  };
  // What no read covers in a block's run (padding) is zeroed, as the engine holds it: `covered` is
  // the block's reads' destinations, sorted.
  using Covered = std::vector<std::pair<std::byte*, std::byte*>>;
  auto covered_by_block = [&](const std::vector<Planned>& planned) {
    std::vector<Covered> covered(plan.blocks.size());
    for (const auto& p : planned)
      if (!p.in_place) covered[p.block].emplace_back(p.read.dst, p.read.dst + p.read.bytes);
    for (auto& c : covered) std::sort(c.begin(), c.end());
    return covered;
  };
  auto zero_gaps = [&](const Covered& covered, size_t b, float* run) {
    for (size_t s = 0; s < states.size(); ++s) {
      if (in_place[b][s] != nullptr) continue;  // the engine's: zero outside its parameters already
      auto* at = reinterpret_cast<std::byte*>(run + runs[b].at[s]);
      auto* end = reinterpret_cast<std::byte*>(run + (s + 1 < states.size() ? runs[b].at[s + 1] : runs[b].floats));
      for (const auto& [lo, hi] : covered) {
        if (hi <= at || lo >= end) continue;
        if (lo > at) std::memset(at, 0, static_cast<size_t>(lo - at));
        at = std::max(at, hi);
      }
      if (end > at) std::memset(at, 0, static_cast<size_t>(end - at));
    }
  };

  // Three ways, the first that applies:
  // - direct: into a pristine engine, each block written as soon as its pieces have streamed in
  //   (through one block-sized buffer; the pieces in files other ranks verify read beside), when
  //   the blocks arrive in order; a file that fails to verify puts the engine back as it was.
  // - landing: the whole state into one host buffer while the files stream in, the engine written
  //   from it once every file has verified.
  // - two passes: the files verified, then read again block by block.
  enum class Way { direct, landing, two_passes } way = Way::two_passes;
  offload::AlignedBuffer buffer;
  std::vector<Planned> planned;
  std::vector<Covered> covered;
  // This rank's failure before the outcomes are exchanged (memory, I/O set-up, a write into the
  // engine): it rides along, so no rank is left waiting in the exchange.
  std::exception_ptr error;
  std::vector<uint64_t> checks(2 * files + 1, 0);
  try {
    if (options.stream_into_engine && engine.pristine()) {
      buffer = offload::AlignedBuffer(largest * sizeof(float));
      auto in_buffer = [&](size_t b, size_t s) { return reinterpret_cast<float*>(buffer.data()) + runs[b].at[s]; };
      planned = plan_reads(in_buffer);
      std::vector<Planned> streamed;
      std::copy_if(planned.begin(), planned.end(), std::back_inserter(streamed),
                   [&](const Planned& p) { return streams(p.read.file); });
      if (std::is_sorted(streamed.begin(), streamed.end(), [](const Planned& x, const Planned& y) { return x.block < y.block; })) {
        way = Way::direct;
        // What lies in host memory as f32 is read straight into it (a pristine engine holds zeros
        // outside its parameters already); the rest goes through the block's buffer, whose pages
        // only that touches.
        for (size_t b = 0; b < plan.blocks.size(); ++b) {
          in_place[b][0] = engine.values_in_place(static_cast<int>(b));
          for (size_t s = 1; s < states.size(); ++s) in_place[b][s] = engine.owned_in_place(states[s].kind, static_cast<int>(b));
        }
        planned = plan_reads([&](size_t b, size_t s) { return in_place[b][s] != nullptr ? in_place[b][s] : in_buffer(b, s); });
      }
    }
    // The ranks of a node read the available memory at once: each takes its share of the half.
    const uint64_t limit = options.landing_bytes_limit.value_or(available_memory() / 2 / static_cast<uint64_t>(ranks));
    if (way != Way::direct) buffer = {}, planned.clear();
    if (way != Way::direct && total_floats * sizeof(float) <= limit) {
      buffer = offload::AlignedBuffer(total_floats * sizeof(float));
      std::vector<size_t> first(plan.blocks.size());
      for (size_t b = 1; b < first.size(); ++b) first[b] = first[b - 1] + runs[b - 1].floats;
      planned = plan_reads([&](size_t b, size_t s) { return reinterpret_cast<float*>(buffer.data()) + first[b] + runs[b].at[s]; });
      covered = covered_by_block(planned);
      for (size_t b = 0; b < plan.blocks.size(); ++b) zero_gaps(covered[b], b, reinterpret_cast<float*>(buffer.data()) + first[b]);
      way = Way::landing;
    }
    if (way == Way::direct) covered = covered_by_block(planned);

    // Verification, the files split between the ranks; every rank learns every outcome. A rank
    // takes what it needs of the files it verifies out of the stream.
    const offload::IoOptions io = io_options(engine.config().aio);
    // Direct: the bytes of each block still to stream in, and what it needs of the files other
    // ranks verify, read when its turn comes (unverified then: should any file fail, the engine is
    // put back).
    std::vector<uint64_t> left(plan.blocks.size(), 0);
    std::vector<std::vector<ByteRead>> foreign(plan.blocks.size());
    for (const auto& p : planned) {
      if (streams(p.read.file)) {
        left[p.block] += p.read.bytes;
      } else {
        foreign[p.block].push_back(p.read);
      }
    }
    bool damaged = false;   // a file this rank verifies failed: nothing more is written
    size_t next_block = 0;  // direct: the blocks before it are written
    auto write_blocks = [&](size_t until) {
      for (; next_block < until && !damaged; ++next_block) {
        reader.fetch(std::move(foreign[next_block]));
        zero_gaps(covered[next_block], next_block, reinterpret_cast<float*>(buffer.data()));
        apply(next_block, reinterpret_cast<const float*>(buffer.data()));
      }
    };
    for (size_t f = static_cast<size_t>(rank); f < files; f += static_cast<size_t>(ranks)) {
      auto first = std::lower_bound(planned.begin(), planned.end(), static_cast<int>(f),
                                    [](const Planned& p, int file) { return p.read.file < file; });
      const FileCheck c = verify_file(step_dir, m.files[f], io, [&](uint64_t offset, const std::byte* data, size_t bytes) {
        const uint64_t end = offset + bytes;
        for (auto p = first; p != planned.end() && p->read.file == static_cast<int>(f) && p->read.offset < end; ++p) {
          const uint64_t a = std::max(offset, p->read.offset), e = std::min(end, p->read.offset + p->read.bytes);
          if (a >= e) continue;
          // A block with nothing in the files streamed so far is written (zeros and foreign
          // pieces) when the stream passes it; one block's buffer holds one block at a time.
          if (way == Way::direct) write_blocks(p->block);
          std::memcpy(p->read.dst + (a - p->read.offset), data + (a - offset), e - a);
          if (way == Way::direct && (left[p->block] -= e - a) == 0) write_blocks(p->block + 1);
        }
        while (first != planned.end() && first->read.file == static_cast<int>(f) && first->read.offset + first->read.bytes <= end)
          ++first;
      });
      checks[2 * f] = static_cast<uint64_t>(c.problem), checks[2 * f + 1] = c.found;
      io_stats.bytes += c.read_bytes;
      damaged = damaged || c.problem != FileCheck::Problem::none;
    }
    if (way == Way::direct) write_blocks(plan.blocks.size());
  } catch (...) {
    error = std::current_exception();
    checks.back() = 1;
  }
  const auto all = all_gather_words(engine, checks);
  std::string problems;
  for (size_t f = 0; f < files; ++f) {
    const size_t r = f % static_cast<size_t>(ranks), at = r * (2 * files + 1) + 2 * f;
    const FileCheck c{static_cast<FileCheck::Problem>(all[at]), all[at + 1]};
    if (c.problem != FileCheck::Problem::none) problems += (problems.empty() ? "" : "; ") + c.describe(step_dir, m.files[f]);
  }
  // A rank writing into its engine may have failed on a damaged file before its verifier saw the
  // damage: the files' problems say what is wrong, then a rank's own error.
  std::string failed;
  for (size_t r = 0; r < static_cast<size_t>(ranks); ++r) {
    if (all[r * (2 * files + 1) + 2 * files] != 0) failed += fmt::format("{}{}", failed.empty() ? "" : ", ", r);
  }
  if (!problems.empty() || !failed.empty()) {
    if (way == Way::direct) engine.reinitialize();  // as it was: nothing of the checkpoint stays
    if (problems.empty() && error) std::rethrow_exception(error);
    if (problems.empty()) problems = fmt::format("rank(s) {} failed while reading it (see their errors)", failed);
    throw CheckpointError(problems + "; the checkpoint cannot be loaded (an earlier step folder may still be whole)");
  }

  Agreement agreement(engine);
  agreement.attempt([&] {
    if (way == Way::landing) {
      // The pieces of files another rank verified (a reshard's), then the engine from the buffer.
      std::vector<ByteRead> rest;
      for (const auto& p : planned)
        if (!streams(p.read.file)) rest.push_back(p.read);
      reader.fetch(std::move(rest));
      for (size_t b = 0, first = 0; b < plan.blocks.size(); first += runs[b++].floats)
        apply(b, reinterpret_cast<const float*>(buffer.data()) + first);
    } else if (way == Way::two_passes) {
      std::vector<float> moments;
      for (size_t b = 0; b < plan.blocks.size(); ++b) {
        engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) { fill(b, 0, lo, hi, values); });
        for (size_t s = 1; s < states.size(); ++s) {
          const OwnedRange& r = plan.range(states[s].kind, static_cast<int>(b));
          moments.assign(r.numel(), 0.0f);  // reused: its pages are touched once, not per block
          fill(b, s, r.lo, r.hi, moments.data());
          engine.write_owned(states[s].kind, static_cast<int>(b), moments);
        }
      }
    }
    io_stats.bytes += reader.bytes_read();
    if (!weights_only) engine.restore_counters(m.engine);
  });
  engine.release_transfer_buffers();
  try {
    agreement.agree(fmt::format("loading the checkpoint {}", step_dir).c_str());
  } catch (...) {
    if (way == Way::direct) engine.reinitialize();
    throw;
  }
  io_stats.all_bytes = m.data_bytes();
  io_stats.way = way == Way::direct    ? "each file read once, into the engine"
                 : way == Way::landing ? "each file read once, through a host buffer"
                                       : "the files verified, then read again";
  io_stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (out != nullptr) *out = m;
  return io_stats;
}

}  // namespace zeroth::ckpt
