// The pieces a checkpoint's save and load share (save.cc, load.cc): the
// engine's tensors and states as the format names them, each rank's file layout, the ranks'
// agreement after a phase that can fail on one of them, and rank 0's publishing of a folder.
// Internal to the engine.
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // uint64_t
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem::path
#include <string>      // std::string
#include <vector>      // std::vector

#include "engine/checkpoint/format.h"  // Manifest
#include "engine/engine.h"             // Engine
#include "engine/plan/plan.h"          // Plan, StateKind

namespace zeroth::ckpt {

struct StateRef {
  StateKind kind;
  std::string name;
};

// fp32 master weights, then the optimizer's arrays.
std::vector<StateRef> engine_states(const Engine& engine);

// A tensor of the engine: a parameter of a block, at [begin, begin + numel) of its flat space; with
// tensor parallelism the rank's slice of it (`split`) of the whole tensor `shape`.
struct TensorRef {
  std::string name;  // "<block>.<parameter>"
  std::vector<int64_t> shape;
  int block;
  size_t begin, numel;
  TensorSplit split = {};
};
std::vector<TensorRef> plan_tensors(const std::vector<BlockSpec>& specs, const Plan& plan);
std::vector<TensorRef> engine_tensors(const Engine& engine);
// What a rank saves: its tensors but a pipeline's second copy of a tied one (the first stage's is
// saved; both load from it) and, off tensor-parallel rank 0, the replicated ones.
std::vector<TensorRef> saved_tensors(const Engine& engine);

// A rank's place among all the ranks that save (pipeline stage x tensor-parallel rank x data-parallel
// rank, the last fastest): its file's number, and the count of files.
int file_index(const Engine& engine);
int file_count(const Engine& engine);

// What rank `rank`'s file holds, in file order: per block, per state, the part of each parameter
// inside the rank's slice [rank * shard, (rank + 1) * shard) of the block's padded space.
struct FilePiece {
  int tensor, state;
  uint64_t lo, hi, offset;
};
std::vector<FilePiece> file_layout(const Plan& plan, const std::vector<TensorRef>& tensors, size_t states, int rank);

// Every rank's `mine` (the same length on every rank) in file_index order: an all-gather of the
// bytes through device memory (gathering moves bytes, so the f32 view changes none) over the
// data-parallel group, then the tensor-parallel one, then the pipeline stages.
std::vector<uint64_t> all_gather_words(Engine& engine, const std::vector<uint64_t>& mine);

// Runs `work`, keeping its error; the ranks then agree, and every rank raises when any failed: its
// own error, or one naming the rank that failed.
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
  std::vector<uint64_t> agree(const char* what, std::vector<uint64_t> extra = {});

 private:
  Engine& engine_;
  std::exception_ptr error_;
};

// The manifest's tensors and their pieces in every rank's file (the data-parallel group's files
// numbered from `first_file`); a tensor-parallel slice's pieces at its part's place in the stored order.
void add_tensors(Manifest& m, const Plan& plan, const std::vector<TensorRef>& tensors, int first_file = 0);
// The run's aio section as the I/O engine takes it.
offload::IoOptions io_options(const AioConfig& aio);
void remove_quietly(const std::filesystem::path& p);
// Makes the checkpoint folder and the new step's temporary folder, clearing the leftovers of saves
// a crash interrupted. IoError naming the folder.
void prepare_folder(const std::filesystem::path& dir, const std::filesystem::path& tmp);
// Rank 0's part after the data files: manifest, renames, `latest`, retention.
void publish(const std::filesystem::path& dir, const std::string& name, const Manifest& manifest, int keep_last);

}  // namespace zeroth::ckpt
