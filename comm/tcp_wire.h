// The TCP store: a handshake, then length-prefixed requests and replies over one connection per
// client. Lengths are checked against the bounds in tcp_store.h before anything is allocated.
//   hello:   "ZST1", u32 protocol version, u32 token length, token -> u8 accepted (0) or refused (1)
//   request: u8 command, u32 key length, u64 value length, key, value
//   reply:   u8 status (0 ok, 1 error), u64 length, bytes (SET: empty; GET: the value; ADD: the new
//            value as 8 bytes; TRY_GET: one byte 0 when absent, else 1 followed by the value;
//            an error: its message)
#pragma once

#include <netdb.h>       // addrinfo
#include <sys/socket.h>  // sockaddr, sockaddr_storage

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zeroth::tcp_wire {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kTryGet = 4 };
enum Answer : uint8_t { kAccepted = 0, kRefused = 1 };
enum Status : uint8_t { kOk = 0, kError = 1 };
using clock = std::chrono::steady_clock;

inline constexpr char kMagic[4] = {'Z', 'S', 'T', '1'};
inline constexpr uint32_t kProtocolVersion = 1;
// Refused connections logged one by one; past these a flood is only counted.
inline constexpr uint64_t kLoggedRefusals = 16;

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
inline constexpr auto kForever = clock::time_point::max();

// Compares in time that depends on the lengths only, so the reply's timing does not say how much
// of a guess was right.
bool same_token(const std::string& a, const std::string& b);
// Ends the write side, drains the peer's input for a short, bounded time, then closes (tcp_wire.cc
// says why).
void close_after_delivery(int fd);
std::string numeric_host(const sockaddr* addr);
std::string numeric_host(const addrinfo* a);
uint16_t port_of(const sockaddr_storage& addr);
int bound_port(int fd);
// "address:port" of the other end, for the log.
std::string peer_name(int fd);
bool is_loopback(const addrinfo* a);
// Writes all bytes; returns false when the peer is gone.
bool write_all(int fd, const void* data, size_t size);
// Reads exactly size bytes before the deadline. Returns false on EOF; throws on timeout.
bool read_all(int fd, void* data, size_t size, clock::time_point deadline, const std::string& what);
// getaddrinfo's list for a stream socket (free with freeaddrinfo); throws CommError naming host and port.
addrinfo* resolve(const std::string& host, int port, bool passive);

}  // namespace zeroth::tcp_wire
