// The checkpoint format: a folder `step-<N>/` with one data file per rank (`rank-<r>.bin`, raw
// little-endian f32 pieces of tensors, no header; r = (pipeline stage x tp + tensor-parallel rank) x
// dp + data-parallel rank) and `manifest.json`, which says everything
// needed to use them without the run that wrote them: the format version, the run's config, the
// world layout (dp, tp, pp, ZeRO stage, offload), the run state (step, loss scaler, data
// position), every file's size and xxHash3-64, and for every tensor its name, shape, dtype and,
// per kind of state (fp32 master weights, then the optimizer's arrays), the pieces that hold it:
// (file, byte offset, first element, end element) of the tensor's flat row-major elements.
//
// Pieces are element ranges of whole tensors, not of any rank's padded shard space, so a reader
// at another dp size or stage finds any element without knowing the writer's layout. A tensor that
// tensor-parallel ranks held in slices records its split (TensorSplit: axis, segments, parts) and is
// stored part after part, each part's elements in its own row-major order; the pieces are ranges of
// that stored order, and a reader at another tp size maps the elements it wants through the split.
//
// A checkpoint folder (run.checkpoint_dir) holds step folders and `latest`, a one-line file
// naming the newest complete one. Everything here is free of the engine, so `zeroth ckpt` reads
// checkpoints without building one.
#pragma once

#include <cstddef>     // std::byte
#include <cstdint>     // uint64_t, int64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error_types.h"           // CheckpointError
#include "offload/aio.h"                // offload::AsyncFile, IoOptions
#include "models/block_api.h"           // TensorSplit
#include "offload/aligned_buffer.h"     // offload::AlignedBuffer
#include "engine/checkpoint/staging.h"  // kStagingBytes, kWriteBuffers, kStreamBuffers

namespace zeroth::ckpt {

inline constexpr int kVersion = 1;
inline constexpr const char* kFormat = "zeroth checkpoint";
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kLatestName = "latest";

struct Piece {
  int file = 0;
  uint64_t offset = 0;  // bytes into the file
  uint64_t lo = 0, hi = 0;
  bool operator==(const Piece&) const = default;
};

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;              // the whole tensor's
  std::vector<std::vector<Piece>> pieces;  // per entry of Manifest::states, sorted by lo: ranges of the stored order
  // The split it was saved in (axis, groups, ranks = its parts; full_shape = shape); axis -1: whole,
  // stored in row-major order.
  TensorSplit split = {};
  // Saved from a frozen block: only the first state (the weights) has pieces; the optimizer's
  // arrays are absent and read as zeros.
  bool frozen = false;
  uint64_t numel() const;
  // The stored position of part `part`'s first element, and of the whole tensor's row-major element
  // `index`.
  uint64_t part_offset(int part) const;
  uint64_t stored_position(uint64_t index) const;
};

struct FileEntry {
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

struct Manifest {
  int version = kVersion;
  int64_t step = 0;
  nlohmann::json world = nlohmann::json::object();   // dp, tp, pp, zero_stage, offload_optimizer, offload_param
  std::string optimizer;                             // its type: adamw, adam, sgd, lion, lamb
  std::vector<std::string> states;                   // "fp32" then the optimizer's arrays (exp_avg, ...)
  nlohmann::json engine = nlohmann::json::object();  // the engine's counters and loss scaler
  nlohmann::json run = nlohmann::json::object();     // the caller's (data position, ...)
  nlohmann::json config = nlohmann::json::object();  // the run's resolved config
  std::vector<FileEntry> files;
  std::vector<TensorEntry> tensors;

  nlohmann::json to_json() const;
  // Parses and checks a manifest: every field present and typed, every tensor's pieces of every
  // state cover it exactly once and lie inside their file. CheckpointError naming `source`.
  static Manifest from_json(const nlohmann::json& j, const std::string& source);
  const TensorEntry* find(const std::string& name) const;
  int state_index(const std::string& state) const;  // -1 when absent
  uint64_t data_bytes() const;                      // all files
};

// A step folder or a checkpoint folder (its `latest`; when that names a folder that is gone, the
// newest complete step folder, with a warning) to the step folder to load. CheckpointError when
// there is none.
std::string resolve(const std::string& path);
// Reads and parses <step folder>/manifest.json (CheckpointError naming it when it is missing or
// not valid).
Manifest read_manifest(const std::string& step_dir);
// A JSON file of the checkpoint's (CheckpointError naming it when it is missing or not valid).
nlohmann::json read_json_file(const std::string& path);
// Whether a data file is there with the manifest's size and checksum. Plain data, so ranks that
// split the verification can exchange the outcome and all describe it the same way.
struct FileCheck {
  enum class Problem : uint8_t { none, missing, wrong_size, corrupted, unreadable };
  Problem problem = Problem::none;
  uint64_t found = 0;  // wrong_size: the size; corrupted: the checksum; unreadable: the offset that failed
  uint64_t read_bytes = 0;
  // "" when none, else what is wrong ("<dir>/rank-00001.bin is truncated: ...").
  std::string describe(const std::string& step_dir, const FileEntry& file) const;
};

// One pass over a data file: read once through io_uring (O_DIRECT, the staging buffers in flight;
// the last partial 4 KiB block with pread), hashed in order, each piece shown to
// `chunk(offset, data, bytes)` before its buffer is reused (a loader copies what it needs out of
// it while the next pieces are on their way).
using ChunkSink = std::function<void(uint64_t offset, const std::byte* data, size_t bytes)>;
FileCheck verify_file(const std::string& step_dir, const FileEntry& file, const offload::IoOptions& io = {},
                      const ChunkSink& chunk = {});

// XXH3-64 while writing: a data file written in pieces, flushed to the disk by finish(). The
// bytes go through the staging buffers to io_uring with O_DIRECT (offload/aio.h), one filling
// while the others are written, so the page cache is neither copied into nor flushed at the end;
// the file is cut to its exact size at finish().
class FileWriter {
 public:
  explicit FileWriter(std::string path, const offload::IoOptions& io = {});
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const void* data, size_t bytes);  // IoError naming the file
  // The last write: `data` (4 KiB-aligned, readable up to the next multiple of 4 KiB past
  // `bytes`) goes to the file in place, kStreamBuffers pieces in flight, without a staging copy.
  void write_in_place(const std::byte* data, size_t bytes);
  FileEntry finish();  // fsync, close; the file's name, size and checksum

 private:
  void submit();
  std::string path_;
  std::unique_ptr<offload::AsyncFile> file_;
  offload::AlignedBuffer staging_[kWriteBuffers];
  offload::IoHandle pending_[kWriteBuffers];
  int current_ = 0;
  size_t filled_ = 0;       // bytes in the current staging buffer
  uint64_t submitted_ = 0;  // bytes handed to the file so far
  uint64_t bytes_ = 0;
  void* state_ = nullptr;  // XXH3_state_t
};

// Bytes [offset, offset + bytes) of data file `file` into dst.
struct ByteRead {
  int file = 0;
  uint64_t offset = 0, bytes = 0;
  std::byte* dst = nullptr;
};

// Reads pieces of a step folder's files (opened on first use).
class Reader {
 public:
  Reader(std::string step_dir, const Manifest& manifest);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  // Row-major elements [lo, hi) of state `state` of `tensor` into `out` (f32).
  void read(const TensorEntry& tensor, int state, uint64_t lo, uint64_t hi, float* out);
  // Elements [lo, hi) of the slice `want` of the tensor (a tensor-parallel rank's, in its own
  // row-major order; axis -1: the whole tensor), whatever split the tensor was saved in.
  void read_slice(const TensorEntry& tensor, int state, const TensorSplit& want, uint64_t lo, uint64_t hi, float* out);
  uint64_t bytes_read() const { return read_; }
  // From here on the reads above are only recorded, into `reads` (the destinations must stay
  // valid until fetched), not made: a loader plans them, then takes them out of a stream.
  void record_into(std::vector<ByteRead>* reads) { record_ = reads; }
  // Makes recorded reads (pread, neighbours merged).
  void fetch(std::vector<ByteRead> reads);

 private:
  int fd(int file);
  void pread_all(int file, uint64_t at, uint64_t bytes, std::byte* dst);
  void read_stored(const TensorEntry& tensor, int state, uint64_t lo, uint64_t hi, float* out);  // stored positions [lo, hi)
  std::string dir_;
  const Manifest& manifest_;
  std::vector<int> fds_;
  uint64_t read_ = 0;
  std::vector<ByteRead>* record_ = nullptr;
};

// "rank-00003.bin"
std::string file_name(int rank);
// "0123456789abcdef"
std::string hex64(uint64_t v);

// Writes `text` to dir/name through a temporary, flushed and renamed, then flushes the folder.
void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text);
// Flushes a folder's entries (after a rename or create in it).
void fsync_dir(const std::string& dir);

}  // namespace zeroth::ckpt
