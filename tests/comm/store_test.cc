// The rendezvous store against strangers, checked through raw sockets that speak its bytes: a
// connection without the job's token can neither read nor write a key; a length past the bounds,
// an unknown command or a truncated request ends only that connection; the store listens only
// where MASTER_ADDR points; the job refuses a store open to other hosts without a token or
// unreachable from them, and ranks that disagree on the job's shape or share a rank.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "comm/rendezvous.h"
#include "comm/tcp_store.h"
#include "core/error.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

// A plain TCP connection to the store, for writing whatever bytes a test wants.
class RawConnection {
 public:
  RawConnection(const char* address, int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address, &addr.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }

  template <typename T>
  void put(const T& value) {
    put_bytes(&value, sizeof value);
  }
  void put_bytes(const void* data, std::size_t size) { ASSERT_EQ(::send(fd_, data, size, MSG_NOSIGNAL), static_cast<ssize_t>(size)); }
  void hello(const std::string& token) {
    put_bytes("ZST1", 4);
    put(uint32_t{1});
    put(static_cast<uint32_t>(token.size()));
    put_bytes(token.data(), token.size());
  }
  void request_header(uint8_t command, uint32_t key_bytes, uint64_t value_bytes) {
    put(command);
    put(key_bytes);
    put(value_bytes);
  }
  void request(uint8_t command, const std::string& key, const std::string& value) {
    request_header(command, static_cast<uint32_t>(key.size()), value.size());
    put_bytes(key.data(), key.size());
    put_bytes(value.data(), value.size());
  }
  // Everything the store sends until it closes the connection, or nullopt when it is still
  // open after `timeout`.
  std::optional<std::string> until_closed(std::chrono::milliseconds timeout) {
    std::string received;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return received;
      received.append(buffer, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

constexpr uint8_t kSet = 1, kGet = 2;
const std::string kToken = "7f3c-job-secret";

TEST(Store, RanksWithTheTokenShareKeysAndCounters) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  TcpStore a("127.0.0.1", server.port(), kToken, 5s), b("127.0.0.1", server.port(), kToken, 5s);
  a.set("address/0", bytes("10.0.0.1:4000"));
  EXPECT_EQ(text(b.get("address/0")), "10.0.0.1:4000");
  EXPECT_EQ(a.add("arrived", 1), 1);
  EXPECT_EQ(b.add("arrived", 1), 2);
  EXPECT_FALSE(b.try_get("absent").has_value());
  EXPECT_EQ(server.refused(), 0u);
}

TEST(Store, AWrongTokenIsRefusedWithAnErrorThatSaysSo) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  try {
    TcpStore stranger("127.0.0.1", server.port(), "guess", 5s);
    FAIL() << "a client with the wrong token was let in";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this process's job token"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ZEROTH_JOB_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TcpStore("127.0.0.1", server.port(), "", 5s), CommError) << "no token at all";
  EXPECT_EQ(server.refused(), 2u);
}

TEST(Store, AConnectionWithoutTheTokenCannotReadOrWriteAKey) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  TcpStore rank("127.0.0.1", server.port(), kToken, 5s);
  rank.set("nccl/unique_id", bytes("the-secret-id"));

  {  // Straight to a request, no handshake: closed, nothing answered.
    RawConnection raw("127.0.0.1", server.port());
    ASSERT_TRUE(raw.connected());
    raw.request(kSet, "planted", "by a stranger");
    const auto answer = raw.until_closed(10s);
    ASSERT_TRUE(answer.has_value()) << "the store kept a connection that never presented a token";
    EXPECT_EQ(*answer, "");
  }
  {  // A reader without the handshake gets nothing of the value.
    RawConnection raw("127.0.0.1", server.port());
    raw.request(kGet, "nccl/unique_id", "");
    const auto answer = raw.until_closed(10s);
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->find("the-secret-id"), std::string::npos);
  }
  {  // The protocol's handshake with a wrong token, then requests: refused (one byte, 1), closed.
    RawConnection raw("127.0.0.1", server.port());
    raw.hello("guess");
    raw.request(kSet, "planted", "by a stranger");
    raw.request(kGet, "nccl/unique_id", "");
    const auto answer = raw.until_closed(10s);
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(*answer, std::string(1, '\1'));
  }
  EXPECT_FALSE(rank.try_get("planted").has_value()) << "a stranger wrote a key";
  EXPECT_EQ(server.refused(), 3u);
}

TEST(Store, LengthsPastTheBoundsAndMalformedRequestsEndOnlyTheirConnection) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  TcpStore rank("127.0.0.1", server.port(), kToken, 5s);
  auto authenticated = [&] {
    auto raw = std::make_unique<RawConnection>("127.0.0.1", server.port());
    raw->hello(kToken);
    return raw;
  };
  struct Case {
    const char* what;
    uint8_t command;
    uint32_t key_bytes;
    uint64_t value_bytes;
  };
  // Each closes the connection at once: the store neither allocates 4 GiB nor waits for bytes
  // that a length promised.
  for (const Case& c :
       {Case{"a 4 GiB value", kSet, 3, uint64_t{4} << 30}, Case{"a value one byte past the bound", kSet, 3, kStoreMaxValueBytes + 1},
        Case{"a 1 MiB key", kGet, 1u << 20, 0}, Case{"an unknown command", 9, 3, 0}}) {
    auto raw = authenticated();
    raw->request_header(c.command, c.key_bytes, c.value_bytes);
    const auto answer = raw->until_closed(10s);
    ASSERT_TRUE(answer.has_value()) << c.what << ": the connection stayed open";
    EXPECT_EQ(*answer, std::string(1, '\0')) << c.what << ": only the handshake's answer was expected";
  }
  {  // Truncated: half a header, then the client goes.
    auto raw = authenticated();
    raw->put(uint8_t{kSet});
    raw->put(uint16_t{3});
  }
  {  // An add whose value is not 8 bytes is an error reply, and the connection carries on.
    auto raw = authenticated();
    raw->request(3, "counter", "12345");
    raw->request(kSet, "after", "still served");
    EXPECT_EQ(text(rank.get("after", 10s)), "still served");
  }
  EXPECT_FALSE(rank.try_get("counter").has_value());
  rank.set("k", bytes("v"));
  EXPECT_EQ(text(rank.get("k")), "v");
  EXPECT_THROW(rank.set(std::string(kStoreMaxKeyBytes + 1, 'k'), {}), InvalidArgument) << "the client checks the bound too";
}

TEST(Store, ASilentConnectionIsClosedAfterTheHandshakeTimeout) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  RawConnection raw("127.0.0.1", server.port());
  const auto answer = raw.until_closed(kStoreHelloTimeout + 20s);
  ASSERT_TRUE(answer.has_value()) << "a connection that never spoke still holds a server thread";
  EXPECT_EQ(*answer, "");
  EXPECT_EQ(server.refused(), 1u);
}

TEST(Store, ListensOnlyWhereMasterAddrPoints) {
  TcpStoreServer server("127.0.0.2", 0, kToken, 5s);
  EXPECT_THROW(TcpStore("127.0.0.1", server.port(), kToken, 300ms), CommError) << "the store answered on another address";
  TcpStore rank("127.0.0.2", server.port(), kToken, 5s);
  rank.set("k", bytes("v"));
  EXPECT_EQ(text(rank.get("k")), "v");
}

TEST(JobStore, RefusesAStoreOpenToOtherHostsWithoutATokenOrOutOfTheirReach) {
  RendezvousInfo info;
  info.rank = 0, info.world_size = 4, info.local_world_size = 4;
  info.master_addr = "198.18.0.1";  // reserved for tests: the check comes before any bind
  info.master_port = 29400;
  try {
    connect_job_store(info, 1s);
    FAIL() << "a store reachable from other hosts started without a token";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ZEROTH_JOB_TOKEN"), std::string::npos) << e.what();
  }
  info.master_addr = "127.0.0.1";
  info.local_world_size = 2;
  info.token = kToken;
  try {
    connect_job_store(info, 1s);
    FAIL() << "a loopback store started for ranks on other hosts";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("2 of the job's 4 ranks run on other hosts"), std::string::npos) << e.what();
  }
}

// Ranks checking in one after another, as nodes launched with different options would.
TEST(JobStore, RanksThatDisagreeOnTheWorldSizeOrShareARankAreClearErrors) {
  TcpStoreServer server("127.0.0.1", 0, kToken, 5s);
  const auto info = [&](int rank, int world) {
    RendezvousInfo i;
    i.rank = rank, i.world_size = world, i.local_world_size = 2, i.source = "torchrun";
    i.master_port = server.port(), i.token = kToken;
    return i;
  };
  TcpStore rank0("127.0.0.1", server.port(), kToken, 5s);
  check_in(rank0, info(0, 4));
  TcpStore rank1("127.0.0.1", server.port(), kToken, 5s);
  check_in(rank1, info(1, 4));
  TcpStore rank2("127.0.0.1", server.port(), kToken, 5s);
  try {
    check_in(rank2, info(2, 6));
    FAIL() << "a rank of a 6-rank job joined a 4-rank one";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 was started for a job of 6 ranks, rank 0 for one of 4"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--nnodes"), std::string::npos) << e.what();
  }
  TcpStore again("127.0.0.1", server.port(), kToken, 5s);
  try {
    check_in(again, info(1, 4));
    FAIL() << "rank 1 checked in twice";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of the job started twice"), std::string::npos) << e.what();
  }
  // The ranks that agreed with the first wait for the others; the first report is there for them.
  const auto report = rank0.try_get(kJobMismatchKey);
  ASSERT_TRUE(report.has_value());
  EXPECT_NE(text(*report).find("job of 6 ranks"), std::string::npos) << text(*report);
}

TEST(JobToken, ComesFromTheVariableOrAFileOnlyItsOwnerCanRead) {
  ::unsetenv("ZEROTH_JOB_TOKEN");
  ::unsetenv("ZEROTH_JOB_TOKEN_FILE");
  EXPECT_EQ(job_token_from_env(), "");

  const std::string path = ::testing::TempDir() + "job_token_test";
  std::ofstream(path) << "from-the-file\n";
  ::setenv("ZEROTH_JOB_TOKEN_FILE", path.c_str(), 1);
  ::chmod(path.c_str(), 0644);
  try {
    job_token_from_env();
    FAIL() << "a token file others can read was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(job_token_from_env(), "from-the-file") << "the trailing newline is not part of the token";
  ::setenv("ZEROTH_JOB_TOKEN", "from-the-variable", 1);
  EXPECT_EQ(job_token_from_env(), "from-the-variable") << "the variable wins over the file";
  ::unsetenv("ZEROTH_JOB_TOKEN");

  std::ofstream(path, std::ios::trunc) << "\n";
  EXPECT_THROW(job_token_from_env(), ConfigError) << "an empty token file";
  std::ofstream(path, std::ios::trunc) << std::string(kMaxJobTokenBytes + 1, 'x');
  EXPECT_THROW(job_token_from_env(), ConfigError) << "a token past the bound";
  ::unlink(path.c_str());
  EXPECT_THROW(job_token_from_env(), ConfigError) << "a missing token file";
  ::unsetenv("ZEROTH_JOB_TOKEN_FILE");

  std::set<std::string> tokens;
  for (int i = 0; i < 4; ++i) {
    const std::string token = generate_job_token();
    EXPECT_EQ(token.size(), 64u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
    tokens.insert(token);
  }
  EXPECT_EQ(tokens.size(), 4u);
}

}  // namespace
}  // namespace zeroth
