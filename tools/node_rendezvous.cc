// Keys of start k in the launchers' store: "round/k/node/R" (node R joined), "round/k/members"
// (node 0's decision: "0,2"), "round/k/failed" (the first cause a node reported).
#include "tools/node_rendezvous.h"

#include <algorithm>  // std::find
#include <thread>     // std::this_thread::sleep_for

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"
#include "tools/launcher.h"  // LaunchOptions

namespace zeroth::tools {

namespace {

using clock = std::chrono::steady_clock;

std::string key(int round, const std::string& what) { return fmt::format("round/{}/{}", round, what); }

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

NodeRendezvous::NodeRendezvous(const LaunchOptions& o, int port, const std::string& token, std::chrono::milliseconds timeout)
    : o_(o), timeout_(timeout) {
  if (o.node_rank == 0) server_ = std::make_unique<TcpStoreServer>(o.master_addr, port, token, timeout);
  store_ = std::make_unique<TcpStore>(o.master_addr, port, token, timeout);
}

NodeRendezvous::~NodeRendezvous() = default;

std::vector<int> NodeRendezvous::decide(int round) {
  const auto opened = clock::now();
  auto enough_since = clock::time_point::max();  // when MIN nodes had joined
  for (;;) {
    std::vector<int> joined;
    for (int node = 0; node < o_.nnodes; ++node) {
      if (store_->try_get(key(round, fmt::format("node/{}", node)))) joined.push_back(node);
    }
    const int n = static_cast<int>(joined.size());
    if (n == o_.nnodes) return joined;
    const auto now = clock::now();
    if (n >= o_.min_nodes()) {
      if (enough_since == clock::time_point::max()) enough_since = now;
      if (now - enough_since >= o_.last_call) return joined;
    } else if (now - opened > timeout_) {
      std::vector<int> missing;
      for (int node = 0; node < o_.nnodes; ++node)
        if (std::find(joined.begin(), joined.end(), node) == joined.end()) missing.push_back(node);
      ZEROTH_THROW(CommError,
                   "start {} of the job: {} of at least {} node(s) joined within {} s (node(s) {} did not): the job cannot go on",
                   round + 1, n, o_.min_nodes(), timeout_.count() / 1000.0, fmt::join(missing, ", "));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::optional<NodeRound> NodeRendezvous::join(int round) {
  store_->set(key(round, fmt::format("node/{}", o_.node_rank)), bytes("1"));
  if (o_.node_rank == 0) store_->set(key(round, "members"), bytes(fmt::format("{}", fmt::join(decide(round), ","))));
  const auto value = store_->get(key(round, "members"), timeout_ + o_.last_call);
  NodeRound r;
  const std::string text(value.begin(), value.end());
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    r.members.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  const auto me = std::find(r.members.begin(), r.members.end(), o_.node_rank);
  if (me == r.members.end()) return std::nullopt;
  r.index = static_cast<int>(me - r.members.begin());
  return r;
}

void NodeRendezvous::fail(int round, const std::string& cause) {
  try {
    if (store_->add(key(round, "failures"), 1) == 1)
      store_->set(key(round, "failed"), bytes(fmt::format("node {}: {}", o_.node_rank, cause)));
  } catch (const CommError&) {
    // Node 0's launcher is gone; the other nodes' ranks learn of the failure from their peers.
  }
}

std::optional<std::string> NodeRendezvous::failure(int round) {
  try {
    const auto value = store_->try_get(key(round, "failed"));
    if (!value) return std::nullopt;
    return std::string(value->begin(), value->end());
  } catch (const CommError&) {
    return std::nullopt;
  }
}

}  // namespace zeroth::tools
