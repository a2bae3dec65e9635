// A small TCP key-value store for rendezvous: rank 0 hosts it at MASTER_ADDR:MASTER_PORT, every
// rank (rank 0 too) is a client. Gloo ships no TCP store; NCCL's unique id travels through it too.
#pragma once

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono::milliseconds
#include <cstddef>             // std::size_t
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // int64_t
#include <map>                 // std::map
#include <optional>            // std::optional
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

namespace zeroth {

// What one connection may send, checked before anything is allocated: a length beyond these
// ends that connection, never the store.
inline constexpr std::size_t kStoreMaxKeyBytes = 4096;
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t{64} << 20;
inline constexpr std::size_t kStoreMaxKeys = std::size_t{1} << 20;
inline constexpr std::size_t kStoreMaxBytes = std::size_t{1} << 30;  // keys and values together
inline constexpr int kStoreMaxConnections = 8192;
// A connection that has not presented the job's token by then is closed, so silent strangers
// cannot hold the server's threads.
inline constexpr std::chrono::seconds kStoreHelloTimeout{10};

// The server side: one thread accepts, one thread per client serves requests. Destruction waits
// (up to the timeout) for every client to disconnect, so the host rank cannot pull the store
// from under ranks that still use it.
class TcpStoreServer {
 public:
  // Listens on the addresses `host` resolves to, not on every interface, at `port` (0: a free
  // one). A connection must present `token` (which may be empty) before any key is read or
  // written; one that does not is refused and closed.
  TcpStoreServer(const std::string& host, int port, std::string token, std::chrono::milliseconds linger);
  ~TcpStoreServer();
  int port() const { return port_; }
  // Connections closed because their handshake was wrong (token, magic, version) or late.
  std::uint64_t refused() const { return refused_.load(); }
  // Serves one connection already open on `fd` on the calling thread until it ends, handshake
  // first, then closes it: the way bytes from a fuzzer reach the same code a socket does.
  void serve_connection(int fd);

 private:
  void accept_loop();
  void serve(int fd);
  bool handshake(int fd);
  // Applies one request under mutex_; false ends the connection.
  bool apply(int fd, std::uint8_t command, const std::string& key, std::vector<char>& value, std::vector<char>& reply, bool& failed);
  void refuse(int fd, const std::string& why);

  std::vector<int> listen_fds_;
  int wake_fd_ = -1;  // eventfd that stops the accept loop
  int port_ = 0;
  std::string token_;
  std::chrono::milliseconds linger_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
  std::size_t stored_bytes_ = 0;
  bool stopping_ = false;
  int clients_ = 0;
  std::vector<int> client_fds_;
  std::vector<std::thread> workers_;
  std::thread acceptor_;
  std::atomic<std::uint64_t> refused_{0};
};

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later), and presents
  // `token`. CommError at once when the server refuses the token.
  TcpStore(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until the key exists (up to the timeout), then returns its value.
  std::vector<char> get(const std::string& key);
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  // The value if the key exists now; never waits.
  std::optional<std::vector<char>> try_get(const std::string& key);
  // The same, waiting at most `timeout` for the store's answer (a peer polling a store that may
  // be out of reach); a request that times out leaves the connection broken().
  std::optional<std::vector<char>> try_get(const std::string& key, std::chrono::milliseconds timeout);
  bool broken() const { return broken_; }
  // Atomically adds delta to an integer key (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const;

 private:
  void handshake(const std::string& token, std::chrono::steady_clock::time_point deadline);
  std::vector<char> request(uint8_t command, const std::string& key, const std::vector<char>& value,
                            std::chrono::milliseconds timeout);

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  bool broken_ = false;  // a timed-out request leaves a reply in flight: the connection is done
  std::mutex mutex_;
};

struct RendezvousInfo;

// The job's store connection: rank 0 hosts the server at MASTER_ADDR:MASTER_PORT, every rank
// is a client, each presenting the job's token. Members go in reverse order, so the server
// outlives its own client.
struct JobStore {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> client;
};
// ConfigError before anything listens when the store would be open to strangers (a non-loopback
// MASTER_ADDR without a token) or unreachable from the job's other hosts (ranks elsewhere and a
// MASTER_ADDR that resolves to loopback here).
JobStore connect_job_store(const RendezvousInfo& info, std::chrono::milliseconds timeout);

}  // namespace zeroth
