// Saving and loading the engine's state as checkpoints (engine/checkpoint/format.h).
//
// Save: every rank writes its slice of every block's padded flat space (slice r of dp, as ZeRO
// partitions it, whatever the stage: a stage-0 rank holds everything but writes only its slice,
// so nothing is written twice), for the fp32 master weights and each optimizer array, padding
// left out, into `<dir>/.tmp-step-<N>/rank-<r>.bin`, checksummed while written and fsync'd. The
// ranks exchange sizes and checksums; rank 0 writes the manifest, flushes the folder, renames it
// to `step-<N>`, flushes `<dir>`, points `latest` at it (written and renamed) and removes what
// falls outside keep_last. A crash at any moment leaves the previous checkpoint and `latest`
// loadable: nothing a loader trusts changes until a rename makes the new one whole.
//
// Load: every rank reads the manifest and checks it against the engine (tensor names and shapes,
// optimizer arrays); the ranks split the files between them and verify each one's size and
// checksum, agree on the outcome (so all ranks fail together, naming the file), then each reads
// exactly the elements it owns under its own plan: another dp size, stage or offload placement
// than the writer's is resharded on the fly.
#pragma once

#include <cstdint>     // uint64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "engine/checkpoint/format.h"  // Manifest
#include "engine/engine.h"             // Engine
#include "offload/aligned_buffer.h"    // offload::AlignedBuffer

namespace zeroth::ckpt {

struct SaveOptions {
  std::string dir;                                   // the checkpoint folder: step folders and `latest`
  int keep_last = 0;                                 // step folders kept, the new one included (0: all)
  nlohmann::json run = nlohmann::json::object();     // the caller's state (data position, ...)
  nlohmann::json config = nlohmann::json::object();  // the run's resolved config
  nlohmann::json world = nlohmann::json::object();   // layout keys beyond the engine's (tp, pp)
};

struct IoStats {
  std::string path;            // the step folder
  uint64_t bytes = 0;          // this rank's: written, or read (verification included)
  uint64_t all_bytes = 0;      // the checkpoint's data files together
  double seconds = 0;          // this rank's wall time, from start to the last agreement
  double blocked_seconds = 0;  // of it, the time the caller waited (all of it unless asynchronous)
  std::string way;             // a load's: how the files were read (LoadOptions)
};

// Collective over the engine's data-parallel group, between cycles. The folder is named by
// engine.steps_run(). IoError when a rank cannot write (every rank raises; nothing of the new
// checkpoint remains and the previous ones are untouched).
IoStats save(Engine& engine, const SaveOptions& options);

// save, or (async) the same save in two halves, so training goes on while the files
// are written: save() copies this rank's slice into host memory (kept for the next save: the
// rank's file size, 12 bytes per owned parameter with Adam) and hands it to a writer thread;
// complete(), called by every rank at the same point (after the next step, say), waits for the
// writes, then agrees and publishes exactly as the synchronous save does. Until then the
// checkpoint does not exist for a loader: a crash in between leaves the previous one.
class Saver {
 public:
  explicit Saver(bool async = false);
  ~Saver();  // an unpublished save is dropped (its writer joined)
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;
  // Collective. Synchronous: the finished save. Asynchronous: the path and blocked_seconds of the
  // started one (a save still in flight is completed first).
  IoStats save(Engine& engine, const SaveOptions& options);
  bool pending() const { return pending_ != nullptr; }
  // Collective: the save in flight, published; seconds from save() to here.
  IoStats complete(Engine& engine);

 private:
  struct Pending;
  bool async_;
  std::unique_ptr<Pending> pending_;
  offload::AlignedBuffer snapshot_;  // the rank's file, kept from save to save
};

// Collective, between cycles, right after finalize (or at any step boundary). `path`: a step
// folder or a checkpoint folder (its latest). Restores the master weights and every copy of
// them, the optimizer arrays, the step counters and the loss scaler; with `weights_only`, the
// weights alone (a run that starts from them: run.init_from). CheckpointError naming the file or
// the mismatch; nothing of the engine changes unless every check passed. `manifest` (optional)
// receives the manifest, for the caller's own state.
//
// Each data file is read once where it can be: its checksum taken while the pieces stream in
// through io_uring, the ones the rank owns taken out of the stream. Into a pristine engine
// (Engine::pristine: a run resuming) whose pieces arrive block after block (the layout that wrote
// them: the same data-parallel size), each block is written as soon as its pieces are in, and the
// engine is put back as finalize() left it when a file fails to verify; otherwise the state lands
// in one host buffer (where it fits in `landing_bytes_limit`, by default the rank's share of half
// the memory the kernel calls available) and the engine is written from it once every file has
// verified; otherwise the files are verified first and read again, block by block.
struct LoadOptions {
  bool stream_into_engine = true;
  std::optional<uint64_t> landing_bytes_limit;
};
IoStats load(Engine& engine, const std::string& path, Manifest* manifest = nullptr, bool weights_only = false,
             const LoadOptions& options = {});

// A checkpoint written without an engine (`zeroth ckpt import`, `reshard`): the files the ranks of
// `plan` (made for `specs` at its dp size) would write, into `<dir>/step-<header.step>` with
// `latest`. `header` gives everything but the files and tensors (world.dp is set from the plan);
// values(tensor, state, lo, hi, out) provides elements [lo, hi) of a tensor (numbered over the
// blocks' parameters in order) and state (an index of header.states) in f32.
using TensorSource = std::function<void(size_t tensor, int state, uint64_t lo, uint64_t hi, float* out)>;
IoStats write(const std::vector<BlockSpec>& specs, const Plan& plan, Manifest header, const TensorSource& values,
              const std::string& dir);

}  // namespace zeroth::ckpt
