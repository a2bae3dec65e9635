// Location and errno formatting shared by the checking macros.
#include "core/error.h"

#include <cctype>   // std::isdigit, std::isalnum
#include <cstring>  // strerror_r

namespace zeroth::detail {

std::string where(const char* file, int line) {
  // Keep the path from the project root only: long absolute paths bury the message.
  std::string_view path(file);
  constexpr std::string_view kRoot = ZEROTH_SOURCE_DIR "/";
  if (path.starts_with(kRoot)) path.remove_prefix(kRoot.size());
  return fmt::format("{}:{}", path, line);
}

std::string without_locations(std::string_view message) {
  // " [" path ":" digits "]", the path of the project's own sources (letters, digits, _ . / -).
  auto location_at = [&](size_t i) -> size_t {
    if (message.compare(i, 2, " [") != 0) return 0;
    size_t j = i + 2, colon = 0;
    while (j < message.size() && message[j] != ']') {
      const char ch = message[j];
      if (ch == ':') {
        if (colon != 0) return 0;
        colon = j;
      } else if (colon != 0 ? !std::isdigit(static_cast<unsigned char>(ch))
                            : !(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '/' || ch == '-')) {
        return 0;
      }
      ++j;
    }
    if (j == message.size() || colon == 0 || colon == i + 2 || colon + 1 == j) return 0;
    const std::string_view path = message.substr(i + 2, colon - i - 2);
    const bool source = path.ends_with(".cc") || path.ends_with(".h") || path.ends_with(".cu") || path.ends_with(".inc");
    return source ? j + 1 - i : 0;
  };
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size();) {
    if (const size_t n = location_at(i); n != 0) {
      i += n;
    } else {
      out += message[i++];
    }
  }
  return out;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", msg, err);
}

}  // namespace zeroth::detail
