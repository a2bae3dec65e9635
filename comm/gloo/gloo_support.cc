// The Gloo communicators' shared helpers: abandoned scratch, naming the ranks lost in a failure,
// and the transport's address.
#include "comm/gloo/gloo_support.h"

#include <algorithm>  // std::count
#include <map>        // std::map
#include <thread>     // std::this_thread::sleep_for

#include <fmt/ranges.h>  // fmt::join
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

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

std::string name_lost_ranks(TcpStore& store, const std::string& prefix, int rank, int size, int peer, const std::string& what) {
  std::string verdict;
  try {
    const std::string key = prefix + "failure/";
    const std::string mine = std::to_string(peer) + "|" + what;
    store.set(key + std::to_string(rank), {mine.begin(), mine.end()});
    std::map<int, int> observed;  // peer -> a rank that saw it fail
    std::vector<bool> reported(size, false);
    const auto grace_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    do {
      observed.clear();
      for (int p = 0; p < size; ++p) {
        auto report = store.try_get(key + std::to_string(p));
        reported[p] = report.has_value();
        if (report) {
          const int seen = std::atoi(std::string(report->begin(), report->end()).c_str());
          if (seen >= 0) observed.emplace(seen, p);
        }
      }
      // Wait out the grace period (a cascading rank may report a moment after us) unless every
      // other rank has reported already.
      if (std::count(reported.begin(), reported.end(), true) == size) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < grace_end);
    for (auto& [seen, by] : observed) {
      if (!reported[seen]) verdict += fmt::format("{}rank {} (seen failing by rank {})", verdict.empty() ? "" : ", ", seen, by);
    }
    if (!verdict.empty()) verdict = "; the rank(s) that died or stalled: " + verdict;
  } catch (const CommError&) {
    verdict = "; the rendezvous store hosted by rank 0 is unreachable: rank 0 died or exited";
  }
  return verdict;
}

namespace {

// "; ranks 2, 3 never arrived": those that posted no arrival key (or "" when all did, or the store
// is gone), and why, when a rank found that the job's ranks disagree. It asks over a connection
// of its own: the timed-out wait left the rank's unusable.
std::string name_missing_ranks(const RendezvousInfo& info, const std::string& prefix) {
  std::vector<int> missing;
  std::optional<std::vector<char>> mismatch;
  try {
    TcpStore store(info.master_addr, info.master_port, info.token, std::chrono::seconds(5));
    for (int p = 0; p < info.world_size; ++p) {
      if (!store.try_get(prefix + "arrived/" + std::to_string(p))) missing.push_back(p);
    }
    mismatch = store.try_get(kJobMismatchKey);
  } catch (const CommError&) {
    return "";
  }
  std::string text;
  if (!missing.empty()) text = fmt::format("; {} {} never arrived", missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "));
  if (mismatch) text += "; " + std::string(mismatch->begin(), mismatch->end());
  return text;
}

}  // namespace

std::shared_ptr<gloo::Context> connect_world(Shared& shared, const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  const std::string prefix = "world/";
  const auto failed = [&](const std::string& why) {
    return fmt::format("gloo rendezvous of rank {} of {} through {}:{} failed: {}", info.rank, info.world_size, info.master_addr,
                       info.master_port, why);
  };
  try {
    shared.device = gloo::transport::tcp::CreateDevice(transport_attr(info));
    auto ctx = std::make_shared<gloo::rendezvous::Context>(info.rank, info.world_size);
    ctx->setTimeout(timeout);
    shared.store->set(prefix + "arrived/" + std::to_string(info.rank), {'1'});
    PrefixedStore store(*shared.store, prefix);
    try {
      ctx->connectFullMesh(store, shared.device);
    } catch (const CommError& e) {
      throw CommError(failed(e.what()) + name_missing_ranks(info, prefix));
    }
    return ctx;
  } catch (const gloo::Exception& e) {
    throw CommError(failed(e.what()));
  }
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
