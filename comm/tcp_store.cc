// The TCP store: a length-prefixed request/reply protocol over one connection per client.
//   request: u8 command, u32 key length, key, u64 value length, value
//   reply:   u64 length, bytes (SET: empty; GET: the value; ADD: the new value as 8 bytes;
//            TRY_GET: one byte 0 when absent, else 1 followed by the value)
#include "comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>  // memcpy

#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kTryGet = 4 };
using clock = std::chrono::steady_clock;

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

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::chrono::milliseconds linger) : linger_(linger) {
  // Listen on every address: MASTER_ADDR names this host for the clients, the bind need not.
  (void)host;
  addrinfo* info = resolve("", port, true);
  std::string errors;
  for (addrinfo* a = info; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) {
      const int zero = 0;  // accept IPv4 clients on the IPv6 socket too
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
    } else {
      errors += detail::errno_text(errno) + "; ";
      ::close(fd);
    }
  }
  ::freeaddrinfo(info);
  if (listen_fd_ < 0) {
    ZEROTH_THROW(CommError, "store server: cannot listen on port {}: {}(is another job using MASTER_PORT={}?)", port, errors, port);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  SYSCALL_CHECK(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len));
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
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
  ::close(listen_fd_);
}

void TcpStoreServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ZLOG_ERROR("store server: poll failed: {}", detail::errno_text(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    ++clients_;
    client_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  try {
    for (;;) {
      uint8_t command = 0;
      uint32_t key_len = 0;
      uint64_t value_len = 0;
      if (!read_all(fd, &command, 1, kForever, "store server")) break;
      if (!read_all(fd, &key_len, 4, kForever, "store server")) break;
      std::string key(key_len, '\0');
      if (!read_all(fd, key.data(), key_len, kForever, "store server")) break;
      if (!read_all(fd, &value_len, 8, kForever, "store server")) break;
      std::vector<char> value(value_len);
      if (!read_all(fd, value.data(), value_len, kForever, "store server")) break;

      std::vector<char> reply;
      {
        std::unique_lock lock(mutex_);
        if (command == kSet) {
          data_[key] = std::move(value);
          changed_.notify_all();
        } else if (command == kGet) {
          // Wake now and then to notice a client that hung up while waiting.
          bool gone = false;
          while (!stopping_ && data_.count(key) == 0 && !gone) {
            changed_.wait_for(lock, std::chrono::milliseconds(200));
            pollfd pfd{fd, POLLRDHUP, 0};
            gone = ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
          }
          if (stopping_ || gone) break;
          reply = data_[key];
        } else if (command == kTryGet) {
          auto it = data_.find(key);
          reply.push_back(it == data_.end() ? 0 : 1);
          if (it != data_.end()) reply.insert(reply.end(), it->second.begin(), it->second.end());
        } else if (command == kAdd) {
          int64_t delta = 0, current = 0;
          std::memcpy(&delta, value.data(), std::min<size_t>(8, value.size()));
          auto& slot = data_[key];
          if (slot.size() == 8) std::memcpy(&current, slot.data(), 8);
          current += delta;
          slot.assign(reinterpret_cast<char*>(&current), reinterpret_cast<char*>(&current) + 8);
          reply = slot;
          changed_.notify_all();
        } else {
          ZLOG_WARN("store server: unknown command {} from a client; closing it", command);
          break;
        }
      }
      const uint64_t n = reply.size();
      if (!write_all(fd, &n, 8) || !write_all(fd, reply.data(), reply.size())) break;
    }
  } catch (const std::exception& e) {
    ZLOG_WARN("store server: client connection failed: {}", e.what());
  }
  std::lock_guard lock(mutex_);
  --clients_;
  std::erase(client_fds_, fd);
  ::close(fd);
  changed_.notify_all();
}

// ---- client ---------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
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
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::address() const { return host_ + ":" + std::to_string(port_); }

std::vector<char> TcpStore::request(uint8_t command, const std::string& key, const std::vector<char>& value,
                                    std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  const std::string what = fmt::format("store {} (key '{}')", address(), key);
  if (broken_) ZEROTH_THROW(CommError, "{}: the connection failed earlier and cannot be reused", what);
  const uint32_t key_len = static_cast<uint32_t>(key.size());
  const uint64_t value_len = value.size();
  if (!write_all(fd_, &command, 1) || !write_all(fd_, &key_len, 4) || !write_all(fd_, key.data(), key.size()) ||
      !write_all(fd_, &value_len, 8) || !write_all(fd_, value.data(), value.size())) {
    broken_ = true;
    ZEROTH_THROW(CommError, "{}: the store closed the connection (rank 0 exited?)", what);
  }
  const auto deadline = clock::now() + timeout;
  uint64_t n = 0;
  std::vector<char> reply;
  try {
    if (!read_all(fd_, &n, 8, deadline, what)) ZEROTH_THROW(CommError, "{}: the store closed the connection (rank 0 exited?)", what);
    reply.resize(n);
    if (!read_all(fd_, reply.data(), n, deadline, what)) ZEROTH_THROW(CommError, "{}: the store closed the connection", what);
  } catch (...) {
    broken_ = true;
    throw;
  }
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

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key) {
  auto reply = request(kTryGet, key, {}, timeout_);
  if (reply.empty() || reply[0] == 0) return std::nullopt;
  return std::vector<char>(reply.begin() + 1, reply.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::vector<char> value(8);
  std::memcpy(value.data(), &delta, 8);
  const auto reply = request(kAdd, key, value, timeout_);
  int64_t result = 0;
  std::memcpy(&result, reply.data(), std::min<size_t>(8, reply.size()));
  return result;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    get(key, std::max(left, std::chrono::milliseconds(1)));
  }
}

JobStore connect_job_store(const std::string& master_addr, int master_port, bool host, std::chrono::milliseconds timeout) {
  JobStore job;
  if (host) job.server = std::make_unique<TcpStoreServer>(master_addr, master_port, timeout);
  job.client = std::make_unique<TcpStore>(master_addr, master_port, timeout);
  return job;
}

}  // namespace zeroth
