// Bytes a peer sends to the rendezvous store: a server of its own per input serves them through
// the same code a TCP connection reaches (TcpStoreServer::serve_connection on a socket pair),
// handshake first; the job's token is empty here so inputs can get past it. The store may close
// the connection or answer; it must not crash, hang, leak or allocate what a length claims.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>

#include "comm/tcp_store.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) __builtin_trap();
  zeroth::TcpStoreServer server("127.0.0.1", 0, "", std::chrono::milliseconds(0));
  // The peer: sends the input, says it is done, and reads every answer until the store closes.
  std::thread peer([&] {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(fds[0], data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fds[0], SHUT_WR);
    char sink[4096];
    while (::recv(fds[0], sink, sizeof sink, 0) > 0) {
    }
    ::close(fds[0]);
  });
  server.serve_connection(fds[1]);
  peer.join();
  return 0;
}
