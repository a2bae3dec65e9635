#include "offload/io_fault.h"

#include <cerrno>     // EIO, ENOSPC
#include <exception>  // std::exception

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "offload/aligned_buffer.h"  // kIoAlignment

namespace zeroth::offload {

std::unique_ptr<IoFault> IoFault::for_file(const std::string& path) {
  const auto text = env::get(env::kIoFault);
  if (!text) return nullptr;
  const auto bad = [&](const char* why) {
    ZEROTH_THROW(ConfigError, "{}={}: {}; the form is OP:ERROR:OFFSET[:FILE], e.g. write:ENOSPC:0:rank-00001.bin", env::kIoFault,
                 *text, why);
  };
  const std::string& t = *text;
  constexpr auto npos = std::string::npos;
  const size_t a = t.find(':'), b = a == npos ? npos : t.find(':', a + 1), c = b == npos ? npos : t.find(':', b + 1);
  if (b == npos) bad("too few parts");
  // The file part takes the rest, colons included.
  const std::string parts[4] = {t.substr(0, a), t.substr(a + 1, b - a - 1), t.substr(b + 1, c == npos ? npos : c - b - 1),
                                c == npos ? std::string() : t.substr(c + 1)};
  auto fault = std::make_unique<IoFault>(path);
  if (parts[0] == "write") fault->is_write_ = true;
  else if (parts[0] != "read") bad("OP must be read or write");
  if (parts[1] == "EIO") fault->error_ = EIO;
  else if (parts[1] == "ENOSPC") fault->error_ = ENOSPC;
  else if (parts[1] != "short") bad("ERROR must be EIO, ENOSPC or short");
  size_t used = 0;
  try {
    fault->offset_ = std::stoull(parts[2], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != parts[2].size()) bad("OFFSET must be a number of bytes");
  if (!parts[3].empty() && path.find(parts[3]) == std::string::npos) return nullptr;
  return fault;
}

bool IoFault::matches(bool is_write, std::uint64_t offset, std::size_t length) const {
  return is_write == is_write_ && offset_ >= offset && offset_ - offset < length;
}

std::size_t IoFault::transfer_length(bool is_write, std::uint64_t offset, std::size_t length) {
  // A short transfer keeps the alignment O_DIRECT needs for the rest; a piece too small to cut
  // is let through.
  const std::size_t half = length / 2 / kIoAlignment * kIoAlignment;
  if (error_ != 0 || half == 0 || !matches(is_write, offset, length) || fired_.exchange(true)) return length;
  ZLOG_WARN("{}: the {} of {} bytes at offset {} of {} goes to the kernel as {} bytes", env::kIoFault, is_write ? "write" : "read",
            length, offset, path_, half);
  return half;
}

long long IoFault::result(bool is_write, std::uint64_t offset, std::size_t length, long long result) {
  if (error_ == 0 || result < 0 || !matches(is_write, offset, length) || fired_.exchange(true)) return result;
  ZLOG_WARN("{}: the {} of {} bytes at offset {} of {} reports {}", env::kIoFault, is_write ? "write" : "read", length, offset, path_,
            zeroth::detail::errno_text(error_));
  return -static_cast<long long>(error_);
}

}  // namespace zeroth::offload
