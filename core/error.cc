// Location and errno formatting shared by the checking macros.
#include "core/error.h"

#include <cstring>  // strerror_r

namespace zeroth::detail {

std::string where(const char* file, int line) {
  // Keep the path from the project root only: long absolute paths bury the message.
  std::string_view path(file);
  constexpr std::string_view kRoot = ZEROTH_SOURCE_DIR "/";
  if (path.starts_with(kRoot)) path.remove_prefix(kRoot.size());
  return fmt::format("{}:{}", path, line);
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", msg, err);
}

}  // namespace zeroth::detail
