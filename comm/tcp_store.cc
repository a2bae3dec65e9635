// The TCP store: a handshake, then length-prefixed requests and replies over one connection per
// client. Lengths are checked against the bounds in tcp_store.h before anything is allocated.
//   hello:   "ZST1", u32 protocol version, u32 token length, token -> u8 accepted (0) or refused (1)
//   request: u8 command, u32 key length, u64 value length, key, value
//   reply:   u8 status (0 ok, 1 error), u64 length, bytes (SET: empty; GET: the value; ADD: the new
//            value as 8 bytes; TRY_GET: one byte 0 when absent, else 1 followed by the value;
//            an error: its message)
#include "comm/tcp_store.h"

#include <arpa/inet.h>  // inet_ntop
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>  // memcpy

#include "comm/rendezvous.h"  // RendezvousInfo, kMaxJobTokenBytes
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kTryGet = 4 };
enum Answer : uint8_t { kAccepted = 0, kRefused = 1 };
enum Status : uint8_t { kOk = 0, kError = 1 };
using clock = std::chrono::steady_clock;

constexpr char kMagic[4] = {'Z', 'S', 'T', '1'};
constexpr uint32_t kProtocolVersion = 1;
// Refused connections logged one by one; past these a flood is only counted.
constexpr uint64_t kLoggedRefusals = 16;

// Packed: their fields may sit at any alignment, so a field is passed on by value (uint32_t{x}),
// never bound to a reference (fmt's arguments are).
#pragma pack(push, 1)
struct Hello {
  char magic[4];
  uint32_t version;
  uint32_t token_bytes;
};
struct RequestHeader {
  uint8_t command;
  uint32_t key_bytes;
  uint64_t value_bytes;
};
struct ReplyHeader {
  uint8_t status;
  uint64_t bytes;
};
#pragma pack(pop)

// Compares in time that depends on the lengths only, so the reply's timing does not say how much
// of a guess was right.
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

// "address:port" of the other end, for the log.
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

// Writes all bytes; returns false when the peer is gone.
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

// Reads exactly size bytes before the deadline. Returns false on EOF; throws on timeout.
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

constexpr auto kForever = clock::time_point::max();

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

}  // namespace

// ---- server ---------------------------------------------------------------------------------

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

// ---- client ---------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  ZEROTH_CHECK(token.size() <= kMaxJobTokenBytes, "job token of {} bytes: at most {}", token.size(), kMaxJobTokenBytes);
  const auto deadline = clock::now() + timeout;
  std::string last_error = "no address";
  while (fd_ < 0) {
    addrinfo* info = nullptr;
    try {
      info = resolve(host, port, false);
    } catch (const CommError& e) {
      last_error = e.what();
    }
    for (addrinfo* a = info; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        last_error = detail::errno_text(errno);
        ::close(fd);
      }
    }
    if (info != nullptr) ::freeaddrinfo(info);
    if (fd_ >= 0) break;
    if (clock::now() >= deadline) {
      ZEROTH_THROW(CommError,
                   "cannot reach the rendezvous store at {}:{} within {} s (last error: {}); check MASTER_ADDR and "
                   "MASTER_PORT and that rank 0 is running",
                   host, port, timeout.count() / 1000.0, last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    handshake(token, std::max(deadline, clock::now() + kStoreHelloTimeout));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

void TcpStore::handshake(const std::string& token, clock::time_point deadline) {
  Hello hello{};
  std::memcpy(hello.magic, kMagic, sizeof hello.magic);
  hello.version = kProtocolVersion;
  hello.token_bytes = static_cast<uint32_t>(token.size());
  const std::string what = fmt::format("the rendezvous store at {}", address());
  uint8_t answer = kRefused;
  if (!write_all(fd_, &hello, sizeof hello) || !write_all(fd_, token.data(), token.size()) ||
      !read_all(fd_, &answer, 1, deadline, what)) {
    ZEROTH_THROW(CommError,
                 "{} closed the connection during the handshake: another program on that port, a zeroth of another version, "
                 "or a token it refused (check the log of rank 0)",
                 what);
  }
  if (answer != kAccepted) {
    ZEROTH_THROW(CommError,
                 "{} refused this process's job token: every rank of a job must have the same ZEROTH_JOB_TOKEN "
                 "(zeroth launch hands one to its ranks; across nodes pass the same --token-file to each node's launcher)",
                 what);
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::address() const { return host_ + ":" + std::to_string(port_); }

std::vector<char> TcpStore::request(uint8_t command, const std::string& key, const std::vector<char>& value,
                                    std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  const std::string what = fmt::format("store {} (key '{}')", address(), key);
  ZEROTH_CHECK(key.size() <= kStoreMaxKeyBytes && value.size() <= kStoreMaxValueBytes,
               "{}: a key of {} bytes and a value of {}: the store takes at most {} and {}", what, key.size(), value.size(),
               kStoreMaxKeyBytes, kStoreMaxValueBytes);
  if (broken_) ZEROTH_THROW(CommError, "{}: the connection failed earlier and cannot be reused", what);
  const RequestHeader header{command, static_cast<uint32_t>(key.size()), value.size()};
  if (!write_all(fd_, &header, sizeof header) || !write_all(fd_, key.data(), key.size()) ||
      !write_all(fd_, value.data(), value.size())) {
    broken_ = true;
    ZEROTH_THROW(CommError, "{}: the store closed the connection (rank 0 exited?)", what);
  }
  const auto deadline = clock::now() + timeout;
  ReplyHeader reply_header{};
  std::vector<char> reply;
  try {
    if (!read_all(fd_, &reply_header, sizeof reply_header, deadline, what))
      ZEROTH_THROW(CommError, "{}: the store closed the connection (rank 0 exited?)", what);
    // The one byte is TRY_GET's presence flag in front of a value.
    if (reply_header.bytes > kStoreMaxValueBytes + 1 || reply_header.status > kError) {
      ZEROTH_THROW(CommError, "{}: the store's reply (status {}, {} bytes) is not one the store sends; is {} a zeroth store?", what,
                   uint8_t{reply_header.status}, uint64_t{reply_header.bytes}, address());
    }
    reply.resize(reply_header.bytes);
    if (!read_all(fd_, reply.data(), reply.size(), deadline, what))
      ZEROTH_THROW(CommError, "{}: the store closed the connection", what);
  } catch (...) {
    broken_ = true;
    throw;
  }
  if (reply_header.status == kError)
    ZEROTH_THROW(CommError, "{}: the store refused the request: {}", what, std::string(reply.begin(), reply.end()));
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) { request(kSet, key, value, timeout_); }

std::vector<char> TcpStore::get(const std::string& key) { return get(key, timeout_); }

std::vector<char> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  try {
    return request(kGet, key, {}, timeout);
  } catch (const CommError& e) {
    ZEROTH_THROW(CommError, "waiting {} s for key '{}' in the rendezvous store failed: {} (a rank never arrived?)",
                 timeout.count() / 1000.0, key, e.what());
  }
}

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key) { return try_get(key, timeout_); }

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key, std::chrono::milliseconds timeout) {
  auto reply = request(kTryGet, key, {}, timeout);
  if (reply.empty() || reply[0] == 0) return std::nullopt;
  return std::vector<char>(reply.begin() + 1, reply.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::vector<char> value(8);
  std::memcpy(value.data(), &delta, 8);
  const auto reply = request(kAdd, key, value, timeout_);
  ZEROTH_CHECK(reply.size() == 8, "store {}: add to '{}' answered {} bytes, not 8", address(), key, reply.size());
  int64_t result = 0;
  std::memcpy(&result, reply.data(), 8);
  return result;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    get(key, std::max(left, std::chrono::milliseconds(1)));
  }
}

JobStore connect_job_store(const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  JobStore job;
  if (info.rank == 0) {
    addrinfo* addresses = resolve(info.master_addr, info.master_port, false);
    bool loopback = true;
    for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) loopback = loopback && is_loopback(a);
    ::freeaddrinfo(addresses);
    if (!loopback && info.token.empty()) {
      ZEROTH_THROW(ConfigError,
                   "MASTER_ADDR={} is reachable from other hosts and the job has no token, so anyone who can reach port {} could "
                   "join it: set ZEROTH_JOB_TOKEN (or ZEROTH_JOB_TOKEN_FILE) to the same secret for every rank, or start the "
                   "ranks with zeroth launch (--token-file across nodes)",
                   info.master_addr, info.master_port);
    }
    if (loopback && info.world_size > info.local_world_size) {
      ZEROTH_THROW(ConfigError,
                   "MASTER_ADDR={} is a loopback address on this host, but {} of the job's {} ranks run on other hosts, which "
                   "cannot reach it: set MASTER_ADDR (--master-addr) to this host's address on the network the nodes share",
                   info.master_addr, info.world_size - info.local_world_size, info.world_size);
    }
    job.server = std::make_unique<TcpStoreServer>(info.master_addr, info.master_port, info.token, timeout);
  }
  job.client = std::make_unique<TcpStore>(info.master_addr, info.master_port, info.token, timeout);
  check_in(*job.client, info);
  return job;
}

}  // namespace zeroth
