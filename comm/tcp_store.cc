// The TCP store's client: one connection, a request and its reply at a time; the wire is in
// tcp_wire.h.
#include "comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>  // memcpy

#include "comm/rendezvous.h"  // RendezvousInfo, kMaxJobTokenBytes
#include "comm/tcp_wire.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

using namespace tcp_wire;

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
