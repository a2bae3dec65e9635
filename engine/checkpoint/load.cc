// Checkpoint load (engine/checkpoint/checkpoint.h): the same checks on every rank, the files' verification
// split between the ranks, then each rank's owned elements read from whichever files hold them.
// One load is a Load's steps, in order: check, lay out, choose the way and plan the reads, verify
// (streaming into the engine where the way allows), agree on the outcome, restore.
#include "engine/checkpoint/checkpoint.h"

#include <algorithm>   // std::sort, std::is_sorted, std::copy_if, std::lower_bound
#include <chrono>      // std::chrono::steady_clock
#include <cstring>     // std::memcpy, std::memset
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem
#include <functional>  // std::function
#include <iterator>    // std::back_inserter
#include <optional>    // std::optional
#include <span>        // std::span

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"                      // CheckpointError
#include "core/memory.h"                     // available_memory
#include "engine/checkpoint/engine_state.h"  // engine_states, engine_tensors, Agreement

namespace zeroth::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

class Load {
 public:
  Load(Engine& engine, bool weights_only, const LoadOptions& options)
      : engine_(engine),
        plan_(engine.plan()),
        rank_(file_index(engine)),
        ranks_(file_count(engine)),
        weights_only_(weights_only),
        options_(options),
        states_(engine_states(engine)),
        tensors_(engine_tensors(engine)) {
    if (weights_only_) states_.resize(1);
  }

  IoStats run(const std::string& path, Manifest* out) {
    const auto t0 = Clock::now();
    check(path);
    lay_out();
    // This rank's failure before the outcomes are exchanged (memory, I/O set-up, a write into the
    // engine): it rides along, so no rank is left waiting in the exchange.
    std::exception_ptr error;
    std::vector<uint64_t> checks(2 * m_.files.size() + 1, 0);
    try {
      choose_way();
      verify(checks);
    } catch (...) {
      error = std::current_exception();
      checks.back() = 1;
    }
    raise_problems(all_gather_words(engine_, checks), error);
    restore();
    io_stats_.all_bytes = m_.data_bytes();
    io_stats_.way = way_ == Way::direct    ? "each file read once, into the engine"
                    : way_ == Way::landing ? "each file read once, through a host buffer"
                                           : "the files verified, then read again";
    io_stats_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (out != nullptr) *out = m_;
    return io_stats_;
  }

 private:
  // What the engine takes of each block, as one run of floats: its values [lo, hi), then each
  // optimizer state's owned range.
  struct BlockRun {
    size_t lo = 0, hi = 0;
    std::vector<size_t> at;  // per state: floats into the run
    size_t floats = 0;
  };
  struct Planned {
    ByteRead read;
    size_t block;
    bool in_place;  // into the engine's memory, not a buffer
  };
  // What no read covers in a block's run (padding) is zeroed, as the engine holds it: `covered` is
  // the block's reads' destinations, sorted.
  using Covered = std::vector<std::pair<std::byte*, std::byte*>>;
  // Three ways, the first that applies:
  // - direct: into a pristine engine, each block written as soon as its pieces have streamed in
  //   (through one block-sized buffer; the pieces in files other ranks verify read beside), when
  //   the blocks arrive in order; a file that fails to verify puts the engine back as it was.
  // - landing: the whole state into one host buffer while the files stream in, the engine written
  //   from it once every file has verified.
  // - two passes: the files verified, then read again block by block.
  enum class Way { direct, landing, two_passes };

  // The same checks on every rank, from the same files; the ranks agree before going on, so a
  // rank that cannot read them (another disk, a file replaced meanwhile) stops them all.
  void check(const std::string& path) {
    // A pipeline's stages hold the model between them: their tensors together must be the
    // checkpoint's (the tied copy counted once).
    // With expert parallelism a rank holds one slice of the experts: the others hold as many tensors.
    size_t expert_tensors = 0;
    for (const auto& t : tensors_) expert_tensors += plan_.blocks[t.block].expert ? 1 : 0;
    size_t model_tensors = tensors_.size() + (plan_.ep - 1) * expert_tensors;
    if (engine_.pipeline_stages() > 1) {
      // Tensor-parallel rank 0 of each stage saves all of the stage's tensors (its slices and the
      // replicated ones).
      const auto counts = all_gather_words(engine_, {saved_tensors(engine_).size() + (plan_.ep - 1) * expert_tensors});
      model_tensors = 0;
      for (int s = 0; s < engine_.pipeline_stages(); ++s)
        model_tensors += counts[static_cast<size_t>(s) * engine_.tensor_ranks() * plan_.dp];
    }
    Agreement early(engine_);
    early.attempt([&] {
      step_dir_ = resolve(path);
      m_ = read_manifest(step_dir_);
      const std::string manifest_path = (fs::path(step_dir_) / kManifestName).string();
      for (const auto& s : states_) {
        const int i = m_.state_index(s.name);
        if (i < 0) {
          throw CheckpointError(
              fmt::format("{}: the checkpoint holds no \"{}\" optimizer state ({} wrote it; its states: {}), which this run's "
                          "{} needs; use the same optimizer type, or start from its weights only (run.init_from)",
                          manifest_path, s.name, m_.optimizer, fmt::join(m_.states, ", "),
                          optimizer_name(engine_.config().optimizer.kind)));
        }
        state_at_.push_back(i);
      }
      for (const auto& t : tensors_) {
        const TensorEntry* c = m_.find(t.name);
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
        found_.push_back(c);
      }
      if (m_.tensors.size() != model_tensors) {
        throw CheckpointError(fmt::format("{}: the checkpoint holds {} tensors, this model {}; it was written for another model",
                                          manifest_path, m_.tensors.size(), model_tensors));
      }
    });
    early.agree("loading a checkpoint");
    io_stats_.path = step_dir_;
    reader_.emplace(step_dir_, m_);
  }

  // Each block's tensors and its run of floats.
  void lay_out() {
    block_tensors_.resize(plan_.blocks.size());
    for (size_t b = 0, first = 0; b < plan_.blocks.size(); ++b) {
      size_t end = first;
      while (end < tensors_.size() && tensors_[end].block == static_cast<int>(b)) ++end;
      block_tensors_[b] = {first, end};
      first = end;
    }
    runs_.resize(plan_.blocks.size());
    for (size_t b = 0; b < plan_.blocks.size(); ++b) {
      BlockRun& r = runs_[b];
      const auto [lo, hi] = plan_.values_range(static_cast<int>(b));
      r.lo = lo, r.hi = hi;
      for (size_t s = 0; s < states_.size(); ++s) {
        r.at.push_back(r.floats);
        if (s < states_of(b)) r.floats += s == 0 ? r.hi - r.lo : plan_.range(states_[s].kind, static_cast<int>(b)).numel();
      }
      total_floats_ += r.floats;
      largest_ = std::max(largest_, r.floats);
    }
    in_place_.assign(plan_.blocks.size(), std::vector<float*>(states_.size(), nullptr));
  }

  // The way (direct, landing, two passes), its buffer and its reads in streamed order.
  void choose_way() {
    if (options_.stream_into_engine && engine_.pristine()) {
      buffer_ = offload::AlignedBuffer(largest_ * sizeof(float));
      auto in_buffer = [&](size_t b, size_t s) { return reinterpret_cast<float*>(buffer_.data()) + runs_[b].at[s]; };
      planned_ = plan_reads(in_buffer);
      std::vector<Planned> streamed;
      std::copy_if(planned_.begin(), planned_.end(), std::back_inserter(streamed),
                   [&](const Planned& p) { return streams(p.read.file); });
      if (std::is_sorted(streamed.begin(), streamed.end(), [](const Planned& x, const Planned& y) { return x.block < y.block; })) {
        way_ = Way::direct;
        // What lies in host memory as f32 is read straight into it (a pristine engine holds zeros
        // outside its parameters already); the rest goes through the block's buffer, whose pages
        // only that touches.
        for (size_t b = 0; b < plan_.blocks.size(); ++b) {
          in_place_[b][0] = engine_.values_in_place(static_cast<int>(b));
          for (size_t s = 1; s < states_of(b); ++s) in_place_[b][s] = engine_.owned_in_place(states_[s].kind, static_cast<int>(b));
        }
        planned_ = plan_reads([&](size_t b, size_t s) { return in_place_[b][s] != nullptr ? in_place_[b][s] : in_buffer(b, s); });
      }
    }
    // The ranks of a node read the available memory at once: each takes its share of the half.
    const uint64_t limit = options_.landing_bytes_limit.value_or(available_memory() / 2 / static_cast<uint64_t>(ranks_));
    if (way_ != Way::direct) buffer_ = {}, planned_.clear();
    if (way_ != Way::direct && total_floats_ * sizeof(float) <= limit) {
      buffer_ = offload::AlignedBuffer(total_floats_ * sizeof(float));
      std::vector<size_t> first(plan_.blocks.size());
      for (size_t b = 1; b < first.size(); ++b) first[b] = first[b - 1] + runs_[b - 1].floats;
      planned_ = plan_reads([&](size_t b, size_t s) { return reinterpret_cast<float*>(buffer_.data()) + first[b] + runs_[b].at[s]; });
      covered_ = covered_by_block(planned_);
      for (size_t b = 0; b < plan_.blocks.size(); ++b) zero_gaps(covered_[b], b, reinterpret_cast<float*>(buffer_.data()) + first[b]);
      way_ = Way::landing;
    }
    if (way_ == Way::direct) covered_ = covered_by_block(planned_);
  }

  // Verification, the files split between the ranks; every rank learns every outcome from
  // `checks` (a problem and what was found, per file). A rank takes what it needs of the files it
  // verifies out of the stream.
  void verify(std::vector<uint64_t>& checks) {
    const offload::IoOptions io = io_options(engine_.config().aio);
    // Direct: the bytes of each block still to stream in, and what it needs of the files other
    // ranks verify, read when its turn comes (unverified then: should any file fail, the engine is
    // put back).
    std::vector<uint64_t> left(plan_.blocks.size(), 0);
    std::vector<std::vector<ByteRead>> foreign(plan_.blocks.size());
    for (const auto& p : planned_) {
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
        reader_->fetch(std::move(foreign[next_block]));
        zero_gaps(covered_[next_block], next_block, reinterpret_cast<float*>(buffer_.data()));
        apply(next_block, reinterpret_cast<const float*>(buffer_.data()));
      }
    };
    const size_t files = m_.files.size();
    for (size_t f = static_cast<size_t>(rank_); f < files; f += static_cast<size_t>(ranks_)) {
      auto first = std::lower_bound(planned_.begin(), planned_.end(), static_cast<int>(f),
                                    [](const Planned& p, int file) { return p.read.file < file; });
      const FileCheck c = verify_file(step_dir_, m_.files[f], io, [&](uint64_t offset, const std::byte* data, size_t bytes) {
        const uint64_t end = offset + bytes;
        for (auto p = first; p != planned_.end() && p->read.file == static_cast<int>(f) && p->read.offset < end; ++p) {
          const uint64_t a = std::max(offset, p->read.offset), e = std::min(end, p->read.offset + p->read.bytes);
          if (a >= e) continue;
          // A block with nothing in the files streamed so far is written (zeros and foreign
          // pieces) when the stream passes it; one block's buffer holds one block at a time.
          if (way_ == Way::direct) write_blocks(p->block);
          std::memcpy(p->read.dst + (a - p->read.offset), data + (a - offset), e - a);
          if (way_ == Way::direct && (left[p->block] -= e - a) == 0) write_blocks(p->block + 1);
        }
        while (first != planned_.end() && first->read.file == static_cast<int>(f) && first->read.offset + first->read.bytes <= end)
          ++first;
      });
      checks[2 * f] = static_cast<uint64_t>(c.problem), checks[2 * f + 1] = c.found;
      io_stats_.bytes += c.read_bytes;
      damaged = damaged || c.problem != FileCheck::Problem::none;
    }
    if (way_ == Way::direct) write_blocks(plan_.blocks.size());
  }

  // Every rank's outcome (`all`: each rank's `checks`, rank-major): the files' problems, then a
  // rank's own error, raised on every rank; the engine put back where the checkpoint went into it.
  void raise_problems(const std::vector<uint64_t>& all, const std::exception_ptr& error) {
    const size_t files = m_.files.size();
    std::string problems;
    for (size_t f = 0; f < files; ++f) {
      const size_t r = f % static_cast<size_t>(ranks_), at = r * (2 * files + 1) + 2 * f;
      const FileCheck c{static_cast<FileCheck::Problem>(all[at]), all[at + 1]};
      if (c.problem != FileCheck::Problem::none) problems += (problems.empty() ? "" : "; ") + c.describe(step_dir_, m_.files[f]);
    }
    // A rank writing into its engine may have failed on a damaged file before its verifier saw the
    // damage: the files' problems say what is wrong, then a rank's own error.
    std::string failed;
    for (size_t r = 0; r < static_cast<size_t>(ranks_); ++r) {
      if (all[r * (2 * files + 1) + 2 * files] != 0) failed += fmt::format("{}{}", failed.empty() ? "" : ", ", r);
    }
    if (problems.empty() && failed.empty()) return;
    if (way_ == Way::direct) engine_.reinitialize();  // as it was: nothing of the checkpoint stays
    if (problems.empty() && error) std::rethrow_exception(error);
    if (problems.empty()) problems = fmt::format("rank(s) {} failed while reading it (see their errors)", failed);
    throw CheckpointError(problems + "; the checkpoint cannot be loaded (an earlier step folder may still be whole)");
  }

  // The engine from the landing buffer, or from a second read of the files; then the counters.
  // The ranks agree on the outcome; a direct load that another rank could not finish is undone.
  void restore() {
    Agreement agreement(engine_);
    agreement.attempt([&] {
      if (way_ == Way::landing) {
        // The pieces of files another rank verified (a reshard's), then the engine from the buffer.
        std::vector<ByteRead> rest;
        for (const auto& p : planned_)
          if (!streams(p.read.file)) rest.push_back(p.read);
        reader_->fetch(std::move(rest));
        for (size_t b = 0, first = 0; b < plan_.blocks.size(); first += runs_[b++].floats)
          apply(b, reinterpret_cast<const float*>(buffer_.data()) + first);
      } else if (way_ == Way::two_passes) {
        std::vector<float> moments;
        for (size_t b = 0; b < plan_.blocks.size(); ++b) {
          engine_.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) { fill(b, 0, lo, hi, values); });
          for (size_t s = 1; s < states_of(b); ++s) {
            const OwnedRange& r = plan_.range(states_[s].kind, static_cast<int>(b));
            moments.assign(r.numel(), 0.0f);  // reused: its pages are touched once, not per block
            fill(b, s, r.lo, r.hi, moments.data());
            engine_.write_owned(states_[s].kind, static_cast<int>(b), moments);
          }
        }
      }
      io_stats_.bytes += reader_->bytes_read();
      if (!weights_only_) engine_.restore_counters(m_.engine);
    });
    engine_.release_transfer_buffers();
    try {
      agreement.agree(fmt::format("loading the checkpoint {}", step_dir_).c_str());
    } catch (...) {
      if (way_ == Way::direct) engine_.reinitialize();
      throw;
    }
  }

  bool streams(int file) const { return file % ranks_ == rank_; }  // the files this rank verifies
  // The states block b holds: a frozen block its weights only (a checkpoint's moments for it are
  // left unread).
  size_t states_of(size_t b) const { return plan_.blocks[b].frozen ? 1 : states_.size(); }

  // Padded elements [lo, hi) of block b's state s, read (or recorded) into `values`.
  void fill(size_t b, size_t s, size_t lo, size_t hi, float* values) {
    for (size_t t = block_tensors_[b].first; t < block_tensors_[b].second; ++t) {
      const size_t a = std::max(lo, tensors_[t].begin), e = std::min(hi, tensors_[t].begin + tensors_[t].numel);
      if (a < e)
        reader_->read_slice(*found_[t], state_at_[s], tensors_[t].split, a - tensors_[t].begin, e - tensors_[t].begin,
                            values + (a - lo));
    }
  }

  // Block b's run into the engine, but for what was read in place.
  void apply(size_t b, const float* run) {
    const BlockRun& r = runs_[b];
    if (in_place_[b][0] == nullptr) {
      engine_.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) {
        ZEROTH_CHECK(lo >= r.lo && hi <= r.hi, "block {}: values [{}, {}) asked for, [{}, {}) read", b, lo, hi, r.lo, r.hi);
        std::memcpy(values, run + (lo - r.lo), (hi - lo) * sizeof(float));
      });
    }
    for (size_t s = 1; s < states_of(b); ++s) {
      if (in_place_[b][s] != nullptr) continue;
      const OwnedRange& o = plan_.range(states_[s].kind, static_cast<int>(b));
      engine_.write_owned(states_[s].kind, static_cast<int>(b), std::span<const float>(run + r.at[s], o.numel()));
    }
  }

  // The reads of every block's run, block after block, with the run of block b's state s at
  // base(b, s), in streamed order: this rank's files one after the other, each from its start.
  std::vector<Planned> plan_reads(const std::function<float*(size_t, size_t)>& base) {
    std::vector<Planned> planned;
    std::vector<ByteRead> reads;
    reader_->record_into(&reads);
    for (size_t b = 0; b < plan_.blocks.size(); ++b) {
      for (size_t s = 0; s < states_of(b); ++s) {
        const OwnedRange* o = s == 0 ? nullptr : &plan_.range(states_[s].kind, static_cast<int>(b));
        fill(b, s, o ? o->lo : runs_[b].lo, o ? o->hi : runs_[b].hi, base(b, s));
        for (const auto& r : reads) planned.push_back({r, b, in_place_[b][s] != nullptr});
        reads.clear();
      }
    }
    reader_->record_into(nullptr);
    std::stable_sort(planned.begin(), planned.end(), [](const Planned& x, const Planned& y) {
      return x.read.file != y.read.file ? x.read.file < y.read.file : x.read.offset < y.read.offset;
    });
    return planned;
  }

  std::vector<Covered> covered_by_block(const std::vector<Planned>& planned) const {
    std::vector<Covered> covered(plan_.blocks.size());
    for (const auto& p : planned)
      if (!p.in_place) covered[p.block].emplace_back(p.read.dst, p.read.dst + p.read.bytes);
    for (auto& c : covered) std::sort(c.begin(), c.end());
    return covered;
  }

  void zero_gaps(const Covered& covered, size_t b, float* run) const {
    for (size_t s = 0; s < states_.size(); ++s) {
      if (in_place_[b][s] != nullptr) continue;  // the engine's: zero outside its parameters already
      auto* at = reinterpret_cast<std::byte*>(run + runs_[b].at[s]);
      auto* end = reinterpret_cast<std::byte*>(run + (s + 1 < states_.size() ? runs_[b].at[s + 1] : runs_[b].floats));
      for (const auto& [lo, hi] : covered) {
        if (hi <= at || lo >= end) continue;
        if (lo > at) std::memset(at, 0, static_cast<size_t>(lo - at));
        at = std::max(at, hi);
      }
      if (end > at) std::memset(at, 0, static_cast<size_t>(end - at));
    }
  }

  Engine& engine_;
  const Plan& plan_;
  const int rank_, ranks_;
  const bool weights_only_;
  const LoadOptions& options_;
  std::vector<StateRef> states_;
  const std::vector<TensorRef> tensors_;
  // check
  std::string step_dir_;
  Manifest m_;
  std::vector<int> state_at_;  // the manifest's index of each engine state
  std::vector<const TensorEntry*> found_;
  std::optional<Reader> reader_;
  // lay_out
  std::vector<std::pair<size_t, size_t>> block_tensors_;  // the tensors of each block: [first, end) of tensors_
  std::vector<BlockRun> runs_;
  size_t total_floats_ = 0, largest_ = 0;
  // Direct: per block and state, the engine's own memory the reads land in (nullptr: the block's
  // buffer, then set_block_values or write_owned).
  std::vector<std::vector<float*>> in_place_;
  // choose_way
  Way way_ = Way::two_passes;
  offload::AlignedBuffer buffer_;
  std::vector<Planned> planned_;
  std::vector<Covered> covered_;
  IoStats io_stats_;
};

}  // namespace

IoStats load(Engine& engine, const std::string& path, Manifest* out, bool weights_only, const LoadOptions& options) {
  return Load(engine, weights_only, options).run(path, out);
}

}  // namespace zeroth::ckpt
