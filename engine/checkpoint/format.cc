// Manifest parsing and checking, checksummed file writing and verification, piece reading.
#include "engine/checkpoint/format.h"

#include <fcntl.h>     // open
#include <sys/stat.h>  // stat
#include <unistd.h>    // pwrite, pread, fsync, close

#include <xxhash.h>  // XXH3_64bits_*

#include <algorithm>   // std::sort
#include <cstdint>     // uintptr_t
#include <cstring>     // std::strerror
#include <deque>       // std::deque
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <future>      // std::async
#include <sstream>     // std::stringstream

#include <fmt/format.h>  // fmt::format

#include "core/cpu/kernels.h"   // cpu::num_threads
#include "core/cpu/parallel.h"  // cpu::for_chunks
#include "core/error.h"         // ZEROTH_THROW, SYSCALL_CHECK
#include "core/json_int.h"      // json_int, json_ints
#include "core/log.h"           // ZLOG_WARN

namespace zeroth::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

// Below this, a piece's checksum and copy are not worth handing to a second thread.
constexpr size_t kParallelBytes = size_t{1} << 20;

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string file_name(int rank) { return fmt::format("rank-{:05d}.bin", rank); }

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

json Manifest::to_json() const {
  json files_j = json::array(), tensors_j = json::array();
  for (const auto& f : files) files_j.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3_64", hex64(f.xxh3)}});
  for (const auto& t : tensors) {
    json tj = {{"name", t.name}, {"shape", t.shape}, {"dtype", "F32"}};
    if (t.split.split()) tj["split"] = {{"axis", t.split.axis}, {"groups", t.split.groups}, {"parts", t.split.ranks}};
    if (t.frozen) tj["frozen"] = true;
    for (size_t s = 0; s < (t.frozen ? 1 : states.size()); ++s) {
      json pieces = json::array();
      for (const auto& p : t.pieces[s]) pieces.push_back({p.file, p.offset, p.lo, p.hi});
      tj[states[s]] = std::move(pieces);
    }
    tensors_j.push_back(std::move(tj));
  }
  return {{"format", kFormat},      {"version", version}, {"step", step},        {"world", world},
          {"optimizer", optimizer}, {"states", states},   {"engine", engine},    {"run", run},
          {"config", config},       {"files", files_j},   {"tensors", tensors_j}};
}

// Long: the manifest read field by field, each checked as it is read (the files before the tensors whose pieces point
// into them); split, the checks would lose the one `bad` and the one catch that word every refusal.
Manifest Manifest::from_json(const json& j, const std::string& source) {
  auto bad = [&](const std::string& what) -> CheckpointError {
    return CheckpointError(
        fmt::format("{}: {}; the checkpoint cannot be used (was it edited or written by something else?)", source, what));
  };
  const auto format = j.is_object() ? j.find("format") : j.end();
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormat)
    throw bad("not a zeroth checkpoint manifest");
  Manifest m;
  try {
    m.version = json_int<int>(j.at("version"));
    if (m.version != kVersion) {
      throw CheckpointError(fmt::format("{}: format version {}, but this zeroth reads version {}; use the zeroth that wrote it",
                                        source, m.version, kVersion));
    }
    m.step = json_int<int64_t>(j.at("step"));
    m.world = j.at("world");
    m.optimizer = j.at("optimizer").get<std::string>();
    m.states = j.at("states").get<std::vector<std::string>>();
    m.engine = j.at("engine");
    // What restoring the counters reads, checked before anything of an engine changes.
    (void)json_int<int64_t>(m.engine.at("steps_applied")), (void)json_int<int64_t>(m.engine.at("steps_run"));
    for (const char* k : {"scale", "iteration", "last_overflow", "hysteresis"}) (void)m.engine.at("loss_scaler").at(k).get<double>();
    m.run = j.at("run");
    m.config = j.at("config");
    for (const auto& f : j.at("files")) {
      FileEntry file{f.at("name").get<std::string>(), json_int<uint64_t>(f.at("bytes")), 0};
      const auto hex = f.at("xxh3_64").get<std::string>();
      size_t used = 0;
      file.xxh3 = hex.size() == 16 ? std::stoull(hex, &used, 16) : 0;
      if (used != 16) throw bad(fmt::format("file {} has the checksum \"{}\", not 16 hex digits", file.name, hex));
      if (file.name.empty() || file.name.find('/') != std::string::npos || file.name.starts_with("."))
        throw bad(fmt::format("the file name \"{}\" is not a plain name in the folder", file.name));
      m.files.push_back(std::move(file));
    }
    for (const auto& t : j.at("tensors")) {
      TensorEntry tensor{t.at("name").get<std::string>(), json_ints<int64_t>(t.at("shape")), {}};
      if (t.at("dtype").get<std::string>() != "F32") throw bad(fmt::format("tensor {} is not F32", tensor.name));
      for (int64_t d : tensor.shape)
        if (d <= 0) throw bad(fmt::format("tensor {} has the shape {}", tensor.name, t.at("shape").dump()));
      if (t.contains("split")) {
        const auto& s = t.at("split");
        tensor.split = {json_int<int>(s.at("axis")), json_int<int>(s.at("groups")), 0, json_int<int>(s.at("parts")), tensor.shape};
        const int rank = static_cast<int>(tensor.shape.size());
        if (tensor.split.axis < 0 || tensor.split.axis >= rank || tensor.split.groups < 1 || tensor.split.ranks < 1 ||
            tensor.shape[tensor.split.axis] % tensor.split.groups != 0 ||
            tensor.shape[tensor.split.axis] / tensor.split.groups < tensor.split.ranks) {
          throw bad(fmt::format("tensor {} has the split {} of the shape {}", tensor.name, s.dump(), t.at("shape").dump()));
        }
        // Its parts are the tensor-parallel ranks that saved it.
        const int tp = m.world.contains("tp") ? json_int<int>(m.world.at("tp")) : 1;
        if (tensor.split.ranks != tp) {
          throw bad(fmt::format("tensor {} is stored in {} tensor-parallel parts, but the world it was saved in has tp = {}",
                                tensor.name, tensor.split.ranks, tp));
        }
      }
      tensor.frozen = t.value("frozen", false);
      for (const auto& state : m.states) {
        if (tensor.frozen && &state != &m.states.front()) {
          if (t.contains(state)) throw bad(fmt::format("tensor {} is frozen but has \"{}\" pieces", tensor.name, state));
          tensor.pieces.emplace_back();
          continue;
        }
        if (!t.contains(state)) throw bad(fmt::format("tensor {} has no \"{}\" pieces", tensor.name, state));
        std::vector<Piece> pieces;
        for (const auto& p : t.at(state))
          pieces.push_back(
              {json_int<int>(p.at(0)), json_int<uint64_t>(p.at(1)), json_int<uint64_t>(p.at(2)), json_int<uint64_t>(p.at(3))});
        std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
        // Every element exactly once, each piece inside its file.
        uint64_t next = 0;
        for (const auto& p : pieces) {
          if (p.lo != next || p.hi <= p.lo) {
            throw bad(fmt::format("the \"{}\" pieces of tensor {} do not cover it exactly once (a piece at [{}, {}) after element {})",
                                  state, tensor.name, p.lo, p.hi, next));
          }
          if (p.file < 0 || static_cast<size_t>(p.file) >= m.files.size())
            throw bad(fmt::format("tensor {} names file #{}, but the manifest lists {} files", tensor.name, p.file, m.files.size()));
          if (p.offset + (p.hi - p.lo) * sizeof(float) > m.files[p.file].bytes) {
            throw bad(fmt::format("tensor {} has a piece past the end of {} ({} bytes)", tensor.name, m.files[p.file].name,
                                  m.files[p.file].bytes));
          }
          next = p.hi;
        }
        if (next != tensor.numel())
          throw bad(
              fmt::format("the \"{}\" pieces of tensor {} hold {} of its {} elements", state, tensor.name, next, tensor.numel()));
        tensor.pieces.push_back(std::move(pieces));
      }
      m.tensors.push_back(std::move(tensor));
    }
  } catch (const json::exception& e) {
    throw bad(fmt::format("a field is missing or has the wrong type ({})", e.what()));
  } catch (const std::invalid_argument&) {
    throw bad("a checksum is not hexadecimal");
  }
  if (m.states.empty() || m.states.front() != "fp32") throw bad("the first state is not \"fp32\"");
  return m;
}

const TensorEntry* Manifest::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int Manifest::state_index(const std::string& state) const {
  for (size_t s = 0; s < states.size(); ++s)
    if (states[s] == state) return static_cast<int>(s);
  return -1;
}

uint64_t Manifest::data_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files) n += f.bytes;
  return n;
}

namespace {

bool has_manifest(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kManifestName, ec);
}

// The step folders of a checkpoint folder that hold a manifest, newest first.
std::vector<std::pair<int64_t, fs::path>> complete_steps(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("step-") || !has_manifest(e.path())) continue;
    try {
      steps.emplace_back(std::stoll(name.substr(5)), e.path());
    } catch (const std::exception&) {
    }
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return steps;
}

}  // namespace

std::string resolve(const std::string& path) {
  const fs::path dir(path);
  if (has_manifest(dir)) return dir.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw CheckpointError(fmt::format("{}: no such checkpoint folder", path));
  std::ifstream latest(dir / kLatestName);
  std::string name;
  if (latest) std::getline(latest, name);
  if (!name.empty() && has_manifest(dir / name)) return (dir / name).string();
  const auto steps = complete_steps(dir);
  if (steps.empty()) {
    throw CheckpointError(
        fmt::format("{}: no checkpoint there (no {}, no step-N folder with a {}); name a checkpoint folder or a step folder", path,
                    kManifestName, kManifestName));
  }
  ZLOG_WARN("{}/{} {}; loading the newest complete checkpoint, {}", path, kLatestName,
            latest ? fmt::format("names \"{}\", which holds no checkpoint", name) : std::string("is missing"),
            steps.front().second.string());
  return steps.front().second.string();
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifestName).string();
  return Manifest::from_json(read_json_file(path), path);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(fmt::format("{}: cannot be read ({}); the checkpoint is incomplete", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {  // bad syntax, or a number past a double's range
    throw CheckpointError(fmt::format("{}: not valid JSON ({}); the checkpoint cannot be used", path, e.what()));
  }
  return j;
}

FileCheck verify_file(const std::string& step_dir, const FileEntry& file, const offload::IoOptions& io, const ChunkSink& chunk) {
  const std::string path = (fs::path(step_dir) / file.name).string();
  FileCheck check;
  struct Descriptor {  // closed however the verification ends
    int fd;
    ~Descriptor() {
      if (fd >= 0) ::close(fd);
    }
  } const opened{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  const int fd = opened.fd;
  if (fd < 0) return {FileCheck::Problem::missing};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file.bytes)
    return {FileCheck::Problem::wrong_size, static_cast<uint64_t>(st.st_size)};
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  // The reader's use of a piece on this thread (the engine's streams belong to it), its checksum
  // beside on another where kernels may use two threads.
  auto take = [&](const std::byte* data, size_t bytes) {
    if (chunk && cpu::num_threads() > 1) {
      auto hashing = std::async(std::launch::async, [&] { XXH3_64bits_update(state.get(), data, bytes); });
      try {
        chunk(check.read_bytes, data, bytes);
      } catch (...) {
        hashing.wait();
        throw;
      }
      hashing.wait();
    } else {
      XXH3_64bits_update(state.get(), data, bytes);
      if (chunk) chunk(check.read_bytes, data, bytes);
    }
    check.read_bytes += bytes;
  };
  // Whole 4 KiB blocks through the rings, the pieces in flight reaped in file order.
  const uint64_t aligned = file.bytes / offload::kIoAlignment * offload::kIoAlignment;
  if (aligned > 0) {
    std::vector<offload::AlignedBuffer> buffers;  // outlive the file, whose close waits for their reads
    for (int i = 0; i < kStreamBuffers; ++i) buffers.emplace_back(kStagingBytes, kStagingAlignment);
    try {
      offload::AsyncFile in(path, offload::AsyncFile::Mode::read_only, io);
      offload::IoHandle pending[kStreamBuffers];
      uint64_t length[kStreamBuffers] = {}, next = 0;
      auto submit = [&](int i) {
        length[i] = std::min<uint64_t>(kStagingBytes, aligned - next);
        pending[i] = in.read(buffers[i].data(), length[i], next);
        next += length[i];
      };
      for (int i = 0; i < kStreamBuffers && next < aligned; ++i) submit(i);
      for (int i = 0; check.read_bytes < aligned; i = (i + 1) % kStreamBuffers) {
        pending[i].wait();
        take(buffers[i].data(), length[i]);
        if (next < aligned) submit(i);
      }
    } catch (const IoError&) {
      return {FileCheck::Problem::unreadable, check.read_bytes, check.read_bytes};
    }
  }
  std::byte tail[offload::kIoAlignment];
  while (check.read_bytes < file.bytes) {
    const ssize_t n = ::pread(fd, tail, file.bytes - check.read_bytes, static_cast<off_t>(check.read_bytes));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      check.problem = FileCheck::Problem::unreadable;
      check.found = check.read_bytes;
      break;
    }
    take(tail, static_cast<size_t>(n));
  }
  const uint64_t hash = XXH3_64bits_digest(state.get());
  if (check.problem == FileCheck::Problem::none && hash != file.xxh3)
    check.problem = FileCheck::Problem::corrupted, check.found = hash;
  return check;
}

std::string FileCheck::describe(const std::string& step_dir, const FileEntry& file) const {
  const std::string path = (fs::path(step_dir) / file.name).string();
  switch (problem) {
    case Problem::none: return "";
    case Problem::missing: return fmt::format("{} is missing or cannot be opened", path);
    case Problem::wrong_size:
      return fmt::format("{} is {}: {} bytes, the manifest says {}", path, found < file.bytes ? "truncated" : "longer than written",
                         found, file.bytes);
    case Problem::corrupted:
      return fmt::format("{} is corrupted: its xxh3-64 checksum is {}, the manifest says {}", path, hex64(found), hex64(file.xxh3));
    case Problem::unreadable: return fmt::format("{} cannot be read past byte {} (an I/O error)", path, found);
  }
  return "";
}

FileWriter::FileWriter(std::string path, const offload::IoOptions& io) : path_(std::move(path)) {
  std::error_code ec;
  fs::remove(path_, ec);  // the writer's own file, fresh: no old bytes past the new end
  file_ = std::make_unique<offload::AsyncFile>(path_, offload::AsyncFile::Mode::read_write, io);
  for (auto& buffer : staging_) buffer = offload::AlignedBuffer(kStagingBytes);
  state_ = XXH3_createState();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

FileWriter::~FileWriter() {
  // A writer given up on (an error elsewhere) lets its writes finish before the buffers go.
  for (auto& p : pending_) {
    try {
      p.wait();
    } catch (const std::exception&) {
    }
  }
  file_.reset();
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void FileWriter::submit() {
  // Only the last block may be partial: O_DIRECT wants whole 4 KiB pages, so its tail is zeroed
  // and cut off again by finish().
  const size_t length = (filled_ + offload::kIoAlignment - 1) / offload::kIoAlignment * offload::kIoAlignment;
  std::memset(staging_[current_].data() + filled_, 0, length - filled_);
  pending_[current_] = file_->write(staging_[current_].data(), length, submitted_);
  submitted_ += filled_;
  filled_ = 0;
  current_ = (current_ + 1) % kWriteBuffers;
  pending_[current_].wait();  // the next buffer's write is done before it fills again
}

void FileWriter::write(const void* data, size_t bytes) {
  ZEROTH_CHECK(submitted_ % offload::kIoAlignment == 0, "{}: written after a partial block", path_);
  const char* p = static_cast<const char*>(data);
  bytes_ += bytes;
  while (bytes > 0) {
    // The checksum and the staging copy of a piece side by side, where kernels may use two threads.
    const size_t n = std::min(bytes, kStagingBytes - filled_);
    if (n >= kParallelBytes) {
      cpu::for_chunks(2, 1, [&](size_t part, size_t) {
        if (part == 0) {
          XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
        } else {
          std::memcpy(staging_[current_].data() + filled_, p, n);
        }
      });
    } else {
      XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
      std::memcpy(staging_[current_].data() + filled_, p, n);
    }
    filled_ += n, p += n, bytes -= n;
    if (filled_ == kStagingBytes) submit();
  }
}

void FileWriter::write_in_place(const std::byte* data, size_t bytes) {
  ZEROTH_CHECK(filled_ == 0 && submitted_ % offload::kIoAlignment == 0 &&
                   reinterpret_cast<uintptr_t>(data) % offload::kIoAlignment == 0,
               "{}: an in-place write needs an aligned buffer at an aligned place in the file", path_);
  std::deque<offload::IoHandle> pending;
  try {
    for (size_t at = 0; at < bytes; at += kStagingBytes) {
      const size_t n = std::min(kStagingBytes, bytes - at);
      XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data + at, n);
      if (pending.size() == static_cast<size_t>(kStreamBuffers)) {
        pending.front().wait();
        pending.pop_front();
      }
      const size_t length = (n + offload::kIoAlignment - 1) / offload::kIoAlignment * offload::kIoAlignment;
      pending.push_back(file_->write(data + at, length, submitted_));
      submitted_ += n, bytes_ += n;
    }
    for (; !pending.empty(); pending.pop_front()) pending.front().wait();
  } catch (...) {
    // The caller's buffer stays untouched until every write of it is over.
    for (auto& h : pending) {
      try {
        h.wait();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

FileEntry FileWriter::finish() {
  if (filled_ > 0) submit();
  for (auto& p : pending_) p.wait();
  file_.reset();  // every write has landed; the rings and the descriptor close
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) ZEROTH_THROW(IoError, "open({}, O_WRONLY) failed: {}", path_, detail::errno_text(errno));
  const int cut = ::ftruncate(fd, static_cast<off_t>(bytes_));
  const int cut_err = errno;
  const int synced = cut == 0 ? ::fsync(fd) : 0;
  const int sync_err = errno;
  ::close(fd);
  if (cut != 0) ZEROTH_THROW(IoError, "ftruncate({}, {}) failed: {}", path_, bytes_, detail::errno_text(cut_err));
  if (synced != 0) ZEROTH_THROW(IoError, "fsync({}) failed: {}; the disk may be full", path_, detail::errno_text(sync_err));
  return {fs::path(path_).filename().string(), bytes_, XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))};
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ZEROTH_THROW(IoError, "open({}, O_DIRECTORY) failed: {}", dir, detail::errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ZEROTH_THROW(IoError, "fsync({}) failed: {}", dir, detail::errno_text(err));
}

void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = (fs::path(dir) / name).string(), tmp = path + ".tmp";
  {
    FileWriter out(tmp);
    out.write(text.data(), text.size());
    out.finish();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ZEROTH_THROW(IoError, "rename({}, {}) failed: {}", tmp, path, detail::errno_text(err));
  }
  fsync_dir(dir);
}

}  // namespace zeroth::ckpt
