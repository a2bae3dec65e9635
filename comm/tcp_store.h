// A small TCP key-value store for rendezvous: rank 0 hosts it at MASTER_ADDR:MASTER_PORT, every
// rank (rank 0 too) is a client. Gloo ships no TCP store; NCCL's unique id travels through it too.
#pragma once

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono::milliseconds
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

// The server side: one thread accepts, one thread per client serves requests. Destruction waits
// (up to the timeout) for every client to disconnect, so the host rank cannot pull the store
// from under ranks that still use it.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::chrono::milliseconds linger);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  void accept_loop();
  void serve(int fd);

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stops the accept loop
  int port_ = 0;
  std::chrono::milliseconds linger_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
  bool stopping_ = false;
  int clients_ = 0;
  std::vector<int> client_fds_;
  std::vector<std::thread> workers_;
  std::thread acceptor_;
};

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later).
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until the key exists (up to the timeout), then returns its value.
  std::vector<char> get(const std::string& key);
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  // The value if the key exists now; never waits.
  std::optional<std::vector<char>> try_get(const std::string& key);
  // Atomically adds delta to an integer key (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const;

 private:
  std::vector<char> request(uint8_t command, const std::string& key, const std::vector<char>& value,
                            std::chrono::milliseconds timeout);

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  bool broken_ = false;  // a timed-out request leaves a reply in flight: the connection is done
  std::mutex mutex_;
};

// The job's store connection: rank 0 hosts the server at MASTER_ADDR:MASTER_PORT, every rank
// is a client. Members go in reverse order, so the server outlives its own client.
struct JobStore {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> client;
};
JobStore connect_job_store(const std::string& master_addr, int master_port, bool host, std::chrono::milliseconds timeout);

}  // namespace zeroth
