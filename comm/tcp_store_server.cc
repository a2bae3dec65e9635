// The TCP store's server: one thread accepting, one per connection serving requests against the
// map; the wire is in tcp_wire.h.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>  // memcpy

#include "comm/rendezvous.h"  // kMaxJobTokenBytes
#include "comm/tcp_store.h"
#include "comm/tcp_wire.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

using namespace tcp_wire;

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string token, std::chrono::milliseconds linger)
    : token_(std::move(token)), linger_(linger) {
  // Only where MASTER_ADDR points: a store on every interface would answer on networks the job
  // never meant to use.
  addrinfo* info = resolve(host, port, true);
  std::string errors;
  for (addrinfo* a = info; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    // With port 0 the first socket picks the port and the others (the host's other addresses)
    // take the same one.
    if (port_ != 0) {
      if (a->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = htons(static_cast<uint16_t>(port_));
      else reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = htons(static_cast<uint16_t>(port_));
    }
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fds_.push_back(fd);
      if (port_ == 0) port_ = bound_port(fd);
    } else {
      errors += fmt::format("{}: {}; ", numeric_host(a), detail::errno_text(errno));
      ::close(fd);
    }
  }
  ::freeaddrinfo(info);
  if (listen_fds_.empty()) {
    ZEROTH_THROW(CommError,
                 "store server: cannot listen at MASTER_ADDR={} port {}: {}(is MASTER_ADDR an address of this host, and is "
                 "another job using MASTER_PORT={}?)",
                 host, port, errors, port);
  }
  wake_fd_ = SYSCALL_CHECK(::eventfd(0, EFD_CLOEXEC));
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, linger_, [&] { return clients_ == 0; })) {
      ZLOG_WARN("store server: {} client(s) still connected after {} s; closing", clients_, linger_.count() / 1000.0);
    }
    stopping_ = true;
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof one) < 0) ZLOG_WARN("store server: waking the acceptor failed: {}", detail::errno_text(errno));
  acceptor_.join();
  for (auto& w : workers_) w.join();
  ::close(wake_fd_);
  for (int fd : listen_fds_) ::close(fd);
}

void TcpStoreServer::accept_loop() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      ZLOG_ERROR("store server: poll failed: {}", detail::errno_text(errno));
      return;
    }
    if (fds.back().revents != 0) return;
    for (std::size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      if (clients_ >= kStoreMaxConnections) {
        // A thread per connection: beyond the bound a flood would take the host's threads.
        if (refused_.fetch_add(1) < kLoggedRefusals)
          ZLOG_WARN("store server: refused {}: already {} connections", peer_name(fd), kStoreMaxConnections);
        ::close(fd);
        continue;
      }
      ++clients_;
      client_fds_.push_back(fd);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }
}

void TcpStoreServer::refuse(int fd, const std::string& why) {
  if (refused_.fetch_add(1) < kLoggedRefusals) ZLOG_WARN("store server: refused the connection from {}: {}", peer_name(fd), why);
}

bool TcpStoreServer::handshake(int fd) {
  const auto deadline = clock::now() + kStoreHelloTimeout;
  Hello hello{};
  try {
    if (!read_all(fd, &hello, sizeof hello, deadline, "store server")) return false;
    if (std::memcmp(hello.magic, kMagic, sizeof hello.magic) != 0) {
      refuse(fd, "it does not speak the store's protocol");
      return false;
    }
    if (hello.version != kProtocolVersion) {
      refuse(fd, fmt::format("protocol version {}, this store speaks {}", uint32_t{hello.version}, kProtocolVersion));
      return false;
    }
    if (hello.token_bytes > kMaxJobTokenBytes) {
      refuse(fd, fmt::format("a token of {} bytes, more than {}", uint32_t{hello.token_bytes}, kMaxJobTokenBytes));
      return false;
    }
    std::string token(hello.token_bytes, '\0');
    if (!read_all(fd, token.data(), token.size(), deadline, "store server")) return false;
    const bool accepted = same_token(token, token_);
    const uint8_t answer = accepted ? kAccepted : kRefused;
    if (!accepted) refuse(fd, "wrong job token (ZEROTH_JOB_TOKEN differs from rank 0's)");
    return write_all(fd, &answer, 1) && accepted;
  } catch (const CommError&) {
    refuse(fd, fmt::format("no handshake within {} s", kStoreHelloTimeout.count()));
    return false;
  }
}

void TcpStoreServer::serve_connection(int fd) {
  {
    std::lock_guard lock(mutex_);
    ++clients_;
    client_fds_.push_back(fd);
  }
  serve(fd);
}

void TcpStoreServer::serve(int fd) {
  try {
    bool open = handshake(fd);
    while (open) {
      RequestHeader header{};
      if (!read_all(fd, &header, sizeof header, kForever, "store server")) break;
      if (header.command < kSet || header.command > kTryGet) {
        ZLOG_WARN("store server: unknown command {} from {}; closing that connection", header.command, peer_name(fd));
        break;
      }
      if (header.key_bytes > kStoreMaxKeyBytes || header.value_bytes > kStoreMaxValueBytes) {
        ZLOG_WARN("store server: a request from {} with a key of {} bytes and a value of {} (at most {} and {}); closing that "
                  "connection",
                  peer_name(fd), uint32_t{header.key_bytes}, uint64_t{header.value_bytes}, kStoreMaxKeyBytes, kStoreMaxValueBytes);
        break;
      }
      std::string key(header.key_bytes, '\0');
      std::vector<char> value(header.value_bytes);
      if (!read_all(fd, key.data(), key.size(), kForever, "store server")) break;
      if (!read_all(fd, value.data(), value.size(), kForever, "store server")) break;
      std::vector<char> reply;
      bool failed = false;
      open = apply(fd, header.command, key, value, reply, failed);
      if (!open) break;
      const ReplyHeader out{failed ? kError : kOk, reply.size()};
      open = write_all(fd, &out, sizeof out) && write_all(fd, reply.data(), reply.size());
    }
  } catch (const std::exception& e) {
    ZLOG_WARN("store server: client connection failed: {}", e.what());
  }
  {
    // Out of the list first, so that the destructor's shutdown does not reach a number the
    // kernel may already have handed to another socket.
    std::lock_guard lock(mutex_);
    std::erase(client_fds_, fd);
  }
  close_after_delivery(fd);
  std::lock_guard lock(mutex_);
  --clients_;
  changed_.notify_all();
}

bool TcpStoreServer::apply(int fd, uint8_t command, const std::string& key, std::vector<char>& value, std::vector<char>& reply,
                           bool& failed) {
  auto error = [&](std::string message) {
    failed = true;
    reply.assign(message.begin(), message.end());
    return true;
  };
  std::unique_lock lock(mutex_);
  if (command == kSet || command == kAdd) {
    auto it = data_.find(key);
    const std::size_t before = it == data_.end() ? 0 : key.size() + it->second.size();
    const std::size_t after = key.size() + (command == kSet ? value.size() : 8);
    if (it == data_.end() && data_.size() >= kStoreMaxKeys)
      return error(fmt::format("the store holds {} keys, its most", kStoreMaxKeys));
    if (stored_bytes_ - before + after > kStoreMaxBytes)
      return error(fmt::format("the store holds {} bytes; key '{}' would pass its {}", stored_bytes_, key, kStoreMaxBytes));
    if (command == kAdd && value.size() != 8) return error(fmt::format("add to '{}' carries {} bytes, not 8", key, value.size()));
    if (command == kAdd && it != data_.end() && it->second.size() != 8)
      return error(fmt::format("add to '{}', which holds {} bytes, not a counter", key, it->second.size()));
    stored_bytes_ = stored_bytes_ - before + after;
    if (command == kSet) {
      data_[key] = std::move(value);
    } else {
      int64_t delta = 0, current = 0;
      std::memcpy(&delta, value.data(), 8);
      auto& slot = data_[key];
      if (slot.size() == 8) std::memcpy(&current, slot.data(), 8);
      // Wraps rather than overflowing: a counter is a rendezvous tally, never near 2^63.
      current = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
      slot.assign(reinterpret_cast<char*>(&current), reinterpret_cast<char*>(&current) + 8);
      reply = slot;
    }
    changed_.notify_all();
  } else if (command == kGet) {
    // Look now and then for a client that hung up while waiting.
    auto hung_up = [&] {
      pollfd pfd{fd, POLLRDHUP, 0};
      return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    };
    bool gone = false;
    while (!stopping_ && data_.count(key) == 0 && !(gone = hung_up())) changed_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_ || gone) return false;
    reply = data_[key];
  } else {
    auto it = data_.find(key);
    reply.push_back(it == data_.end() ? 0 : 1);
    if (it != data_.end()) reply.insert(reply.end(), it->second.begin(), it->second.end());
  }
  return true;
}

}  // namespace zeroth
