// Reading a checkpoint's tensors (engine/checkpoint/format.h): pieces of the step folder's files,
// and a tensor-parallel split's stored order mapped onto the elements a reader wants.
#include <fcntl.h>   // open
#include <unistd.h>  // pread, close

#include <algorithm>   // std::max, std::min, std::sort
#include <filesystem>  // std::filesystem

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // CheckpointError, detail::errno_text
#include "engine/checkpoint/format.h"

namespace zeroth::ckpt {
namespace fs = std::filesystem;

uint64_t TensorEntry::part_offset(int part) const {
  if (!split.split()) return 0;
  const uint64_t across = numel() / static_cast<uint64_t>(shape.at(split.axis)) * split.groups;  // elements per row of a part
  const int64_t seg = shape[split.axis] / split.groups;
  uint64_t at = 0;
  for (int q = 0; q < part; ++q) {
    const auto [b, e] = TensorSplit::part(seg, q, split.ranks);
    at += across * static_cast<uint64_t>(e - b);
  }
  return at;
}

uint64_t TensorEntry::stored_position(uint64_t index) const {
  if (!split.split()) return index;
  uint64_t inner = 1;
  for (size_t d = split.axis + 1; d < shape.size(); ++d) inner *= static_cast<uint64_t>(shape[d]);
  const uint64_t A = static_cast<uint64_t>(shape[split.axis]), seg = A / split.groups;
  const uint64_t o = index / (A * inner), a = index / inner % A, i = index % inner;
  const uint64_t g = a / seg, j = a % seg;
  // The part holding j: the first (seg mod parts) parts hold base + 1 rows.
  const uint64_t parts = static_cast<uint64_t>(split.ranks), base = seg / parts, extra = seg % parts;
  const uint64_t q = j < extra * (base + 1) ? j / (base + 1) : extra + (j - extra * (base + 1)) / base;
  const auto [b, e] = TensorSplit::part(static_cast<int64_t>(seg), static_cast<int>(q), split.ranks);
  const uint64_t len = static_cast<uint64_t>(e - b);
  return part_offset(static_cast<int>(q)) + ((o * split.groups + g) * len + (j - static_cast<uint64_t>(b))) * inner + i;
}

Reader::Reader(std::string step_dir, const Manifest& manifest)
    : dir_(std::move(step_dir)), manifest_(manifest), fds_(manifest.files.size(), -1) {}

Reader::~Reader() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

int Reader::fd(int file) {
  if (fds_[file] < 0) {
    const std::string path = (fs::path(dir_) / manifest_.files[file].name).string();
    fds_[file] = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fds_[file] < 0) throw CheckpointError(fmt::format("{} cannot be opened: {}", path, detail::errno_text(errno)));
  }
  return fds_[file];
}

void Reader::read(const TensorEntry& tensor, int state, uint64_t lo, uint64_t hi, float* out) {
  if (!tensor.split.split()) return read_stored(tensor, state, lo, hi, out);
  // Runs of consecutive stored positions, read one by one.
  uint64_t k = lo;
  while (k < hi) {
    const uint64_t start = tensor.stored_position(k);
    uint64_t end = k + 1;
    while (end < hi && tensor.stored_position(end) == start + (end - k)) ++end;
    read_stored(tensor, state, start, start + (end - k), out + (k - lo));
    k = end;
  }
}

void Reader::read_slice(const TensorEntry& tensor, int state, const TensorSplit& want, uint64_t lo, uint64_t hi, float* out) {
  const TensorSplit& have = tensor.split;
  if (want.split() && have.split() && want.axis == have.axis && want.groups == have.groups && want.ranks == have.ranks) {
    const uint64_t at = tensor.part_offset(want.rank);
    return read_stored(tensor, state, at + lo, at + hi, out);
  }
  want.for_each_run(lo, hi,
                    [&](size_t full, size_t count, size_t local) { read(tensor, state, full, full + count, out + (local - lo)); });
}

void Reader::read_stored(const TensorEntry& tensor, int state, uint64_t lo, uint64_t hi, float* out) {
  for (const auto& p : tensor.pieces[state]) {
    const uint64_t a = std::max(lo, p.lo), e = std::min(hi, p.hi);
    if (a >= e) continue;
    const ByteRead r{p.file, p.offset + (a - p.lo) * sizeof(float), (e - a) * sizeof(float),
                     reinterpret_cast<std::byte*>(out + (a - lo))};
    if (record_ != nullptr) {
      record_->push_back(r);
    } else {
      pread_all(r.file, r.offset, r.bytes, r.dst);
    }
  }
}

void Reader::fetch(std::vector<ByteRead> reads) {
  std::sort(reads.begin(), reads.end(),
            [](const ByteRead& a, const ByteRead& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
  for (size_t i = 0; i < reads.size();) {
    // Neighbours in the file that are neighbours in memory too: one call.
    ByteRead run = reads[i];
    for (++i; i < reads.size() && reads[i].file == run.file && reads[i].offset == run.offset + run.bytes &&
              reads[i].dst == run.dst + run.bytes;
         ++i)
      run.bytes += reads[i].bytes;
    pread_all(run.file, run.offset, run.bytes, run.dst);
  }
}

void Reader::pread_all(int file, uint64_t at, uint64_t want, std::byte* dst) {
  while (want > 0) {
    const ssize_t n = ::pread(fd(file), dst, want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw CheckpointError(fmt::format("{}/{}: pread of {} bytes at {} failed: {}", dir_, manifest_.files[file].name, want, at,
                                        n < 0 ? detail::errno_text(errno) : "the file ends early"));
    }
    dst += n, at += static_cast<uint64_t>(n), want -= static_cast<uint64_t>(n);
    read_ += static_cast<uint64_t>(n);
  }
}

}  // namespace zeroth::ckpt
