// The store's wire: socket helpers shared by its server and its client.
#include "comm/tcp_wire.h"

#include <arpa/inet.h>  // inet_ntop
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "core/error.h"

namespace zeroth::tcp_wire {

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Closes a connection so that what was written reaches the peer. Closing a socket with unread input
// makes the kernel answer with a reset, which can discard the bytes still in flight: a client that
// sent requests after a refused token would see "connection reset" instead of the refusal. So the
// write side ends first (a FIN after the data), and the input is drained for a short, bounded time.
void close_after_delivery(int fd) {
  constexpr auto kDrain = std::chrono::milliseconds(500);
  constexpr std::size_t kDrainBytes = std::size_t{1} << 20;
  ::shutdown(fd, SHUT_WR);
  const auto deadline = clock::now() + kDrain;
  std::size_t drained = 0;
  char sink[4096];
  while (drained < kDrainBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) break;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    drained += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

std::string numeric_host(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof text);
  if (addr->sa_family == AF_INET6) ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text, sizeof text);
  return text;
}
std::string numeric_host(const addrinfo* a) { return numeric_host(a->ai_addr); }

uint16_t port_of(const sockaddr_storage& addr) {
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  SYSCALL_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len));
  return port_of(addr);
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "a peer";
  if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) return "a local peer";
  return fmt::format("{}:{}", numeric_host(reinterpret_cast<const sockaddr*>(&addr)), port_of(addr));
}

bool is_loopback(const addrinfo* a) {
  if (a->ai_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
  if (a->ai_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
  return false;
}

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t size, clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) ZEROTH_THROW(CommError, "{}: timed out", what);
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) ZEROTH_THROW(CommError, "{}: poll failed: {}", what, detail::errno_text(errno));
    if (ready == 0) continue;
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ZEROTH_THROW(CommError, "{}: recv failed: {}", what, detail::errno_text(errno));
    if (n == 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}


addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) ZEROTH_THROW(CommError, "getaddrinfo({}, {}) failed: {}", host, port, gai_strerror(rc));
  return result;
}

}  // namespace zeroth::tcp_wire
