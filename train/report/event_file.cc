// Protocol buffers by hand: an Event is wall_time (field 1, double), step (2, varint),
// file_version (3, string) or summary (5, message); a Summary holds repeated values (1, message),
// each a tag (1, string) and a simple_value (2, float). Little-endian fixed-width fields, varint
// lengths, as the wire format defines.
#include "train/report/event_file.h"

#include <unistd.h>  // gethostname, getpid

#include <array>       // std::array
#include <atomic>      // std::atomic
#include <cerrno>      // errno
#include <chrono>      // std::chrono::system_clock
#include <cstring>     // std::memcpy
#include <filesystem>  // std::filesystem::create_directories

#include <fmt/format.h>

#include "core/error.h"

namespace zeroth {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32cTable = crc32c_table();

void varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}

// A field's key: its number and wire type (0 varint, 1 fixed 64, 2 length-delimited, 5 fixed 32).
void key(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field << 3 | wire)); }

template <typename T>
void fixed(std::string& out, T v) {
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);  // little-endian on every host zeroth builds for
  out.append(bytes, sizeof v);
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_seconds() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~0u;
  for (size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string scalar_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);
    key(v, 2, 5);
    fixed(v, value);
    bytes_field(summary, 1, v);
  }
  std::string e = event_header(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

EventFile::EventFile(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ZEROTH_THROW(IoError, "cannot make the TensorBoard folder {}: {}", dir, ec.message());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const double now = now_seconds();
  // The process's count of event files too, as TensorBoard's own writers add: a run restarted in
  // the same process within the same second gets a file of its own.
  static std::atomic<int> made{0};
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}.{}", dir, static_cast<int64_t>(now), host, ::getpid(), made++);
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) ZEROTH_THROW(IoError, "fopen({}, \"wb\") failed: {}", path_, detail::errno_text(errno));
  std::string version = event_header(now, 0);
  bytes_field(version, 3, "brain.Event:2");
  write_record(version);
  flush();
}

EventFile::~EventFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFile::write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  write_record(scalar_event(now_seconds(), step, scalars));
}

void EventFile::write_record(const std::string& bytes) {
  std::string framed;
  const uint64_t length = bytes.size();
  fixed(framed, length);
  fixed(framed, masked_crc32c(&length, sizeof length));
  framed += bytes;
  fixed(framed, masked_crc32c(bytes.data(), bytes.size()));
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size())
    ZEROTH_THROW(IoError, "writing {} bytes to {} failed: {}; the disk may be full", framed.size(), path_, detail::errno_text(errno));
}

void EventFile::flush() {
  if (std::fflush(file_) != 0) ZEROTH_THROW(IoError, "fflush({}) failed: {}; the disk may be full", path_, detail::errno_text(errno));
}

}  // namespace zeroth
