// TensorBoard's event files, written without TensorFlow: TFRecord framing (each record's length
// and bytes followed by their masked CRC-32C) around `Event` protocol buffers that carry scalar
// `Summary` values, the way TensorBoard's own writers lay them out.
#pragma once

#include <cstdint>  // uint32_t, int64_t
#include <cstdio>   // std::FILE
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace zeroth {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord checks its records.
uint32_t crc32c(const void* data, size_t size);
// TFRecord stores CRCs rotated and offset, so a CRC of bytes that hold CRCs stays well mixed.
uint32_t masked_crc32c(const void* data, size_t size);

// The bytes of one `Event` record: wall time, step, and scalars under their tags.
std::string scalar_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

// An event file `events.out.tfevents.<seconds>.<host>.<pid>.<n>` in `dir` (made if missing), opened
// with the `brain.Event:2` version record TensorBoard expects first. IoError naming the file when it
// cannot be made or written.
class EventFile {
 public:
  explicit EventFile(const std::string& dir);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  void write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace zeroth
