// The Gloo communicators' shared helpers: abandoned scratch and the transport's address.
#include "comm/gloo/gloo_support.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/env.h"
#include "core/error.h"

namespace zeroth::gloo_detail {

void abandon_scratch(std::vector<float> v) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::vector<float>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(v));
}

gloo::transport::tcp::attr transport_attr(const RendezvousInfo& info) {
  gloo::transport::tcp::attr attr;
  if (auto iface = env::get(env::kSocketIfname)) {
    attr.iface = *iface;
    return attr;
  }
  const auto& m = info.master_addr;
  if (m == "localhost" || m.starts_with("127.") || m == "::1") {
    attr.hostname = "127.0.0.1";
    return attr;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(m.c_str(), std::to_string(info.master_port).c_str(), &hints, &res) != 0 || res == nullptr) {
    ZEROTH_THROW(CommError, "cannot resolve MASTER_ADDR '{}'", m);
  }
  const int fd = SYSCALL_CHECK(::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  const int rc2 = rc == 0 ? ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) : -1;
  ::close(fd);
  ::freeaddrinfo(res);
  if (rc2 != 0) ZEROTH_THROW(CommError, "no route to MASTER_ADDR '{}': {}", m, detail::errno_text(errno));
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                                 : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  inet_ntop(local.ss_family, addr, text, sizeof text);
  attr.hostname = text;
  return attr;
}

}  // namespace zeroth::gloo_detail
