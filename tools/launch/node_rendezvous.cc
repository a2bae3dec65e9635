// Keys of start k in the launchers' store: "round/k/node/R" (node R joined), "round/k/members"
// (node 0's decision: "0,2"), "round/k/failed" (the first cause a node reported), "round/k/final"
// (that cause ends the job).
#include "tools/launch/node_rendezvous.h"

#include <algorithm>  // std::find
#include <thread>     // std::this_thread::sleep_for

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"
#include "tools/launch/launcher.h"  // LaunchOptions

namespace zeroth::tools {

namespace {

using clock = std::chrono::steady_clock;

std::string key(int round, const std::string& what) { return fmt::format("round/{}/{}", round, what); }

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The options every node's launcher must be given alike: the job's shape and restart rules.
std::string shared_options(const LaunchOptions& o) {
  const std::string nodes = o.min_nodes() == o.nnodes ? std::to_string(o.nnodes) : fmt::format("{}:{}", o.min_nodes(), o.nnodes);
  return fmt::format("-n {} --nnodes {} --max-restarts {} --last-call {}", o.nproc_per_node, nodes, o.max_restarts,
                     o.last_call.count());
}

}  // namespace

NodeRendezvous::NodeRendezvous(const LaunchOptions& o, int port, const std::string& token, std::chrono::milliseconds timeout)
    : o_(o), port_(port), token_(token), timeout_(timeout) {
  // Nothing needs the store once this launcher ends: it does not wait for the others to go.
  if (o.node_rank == 0) server_ = std::make_unique<TcpStoreServer>(o.master_addr, port, token, std::chrono::seconds(1));
  store_ = std::make_unique<TcpStore>(o.master_addr, port, token, timeout);
  // Nodes launched alike or not at all: a mismatch would otherwise surface as timeouts.
  const std::string mine = shared_options(o);
  if (o.node_rank == 0) {
    store_->set("options", bytes(mine));
    return;
  }
  std::vector<char> value;
  try {
    value = store_->get("options");
  } catch (const CommError& e) {
    ZEROTH_THROW(CommError,
                 "node 0's launcher at {}:{} did not say how it was launched ({}): was it given --max-restarts or --nnodes "
                 "MIN:MAX as this node was ({})?",
                 o.master_addr, port, e.what(), mine);
  }
  const std::string node0(value.begin(), value.end());
  if (node0 == mine) return;
  const std::string why =
      fmt::format("node {}'s launcher was given {}, node 0's {}: launch every node with the same -n, --nnodes, --max-restarts and "
                  "--last-call",
                  o.node_rank, mine, node0);
  // Node 0 reads this only while it waits for nodes to join a start: a latecomer launched
  // otherwise does not end a job that is already running.
  store_->set(fmt::format("refused/{}", o.node_rank), bytes(why));
  ZEROTH_THROW(ConfigError, "{}", why);
}

NodeRendezvous::~NodeRendezvous() = default;

std::optional<std::vector<char>> NodeRendezvous::poll(const std::string& k) { return store_->try_get(k, std::chrono::seconds(1)); }

std::vector<int> NodeRendezvous::decide(int round, const std::function<bool()>& stop) {
  const auto opened = clock::now();
  auto enough_since = clock::time_point::max();  // when MIN nodes had joined
  for (;;) {
    std::vector<int> joined;
    for (int node = 0; node < o_.nnodes; ++node) {
      if (poll(key(round, fmt::format("node/{}", node)))) joined.push_back(node);
    }
    // A node that cannot take part (its options differ, or its launcher got a signal) ends the job.
    if (const auto failed = failure(round); failed && failed->final) {
      ZEROTH_THROW(CommError, "start {} of the job cannot go on: {}", round + 1, failed->cause);
    }
    for (int node = 1; node < o_.nnodes; ++node) {
      if (const auto refused = poll(fmt::format("refused/{}", node))) {
        ZEROTH_THROW(CommError, "start {} of the job cannot go on: node {}: {}", round + 1, node,
                     std::string(refused->begin(), refused->end()));
      }
    }
    const int n = static_cast<int>(joined.size());
    if (n == o_.nnodes || stop()) return joined;
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

NodeRendezvous::Joined NodeRendezvous::join(int round, const std::function<bool()>& stop, NodeRound& out) {
  // A poll that node 0 did not answer in time left the connection unusable: a new one, which
  // says so clearly when node 0's launcher is gone.
  try {
    if (store_->broken()) store_ = std::make_unique<TcpStore>(o_.master_addr, port_, token_, timeout_);
    store_->set(key(round, fmt::format("node/{}", o_.node_rank)), bytes("1"));
  } catch (const CommError& e) {
    ZEROTH_THROW(CommError,
                 "start {} of the job: node 0's launcher is out of reach, and the job cannot go on without it (it "
                 "hosts the stores): {}",
                 round + 1, e.what());
  }
  if (o_.node_rank == 0) {
    const auto members = decide(round, stop);
    if (stop()) return Joined::stopped;
    store_->set(key(round, "members"), bytes(fmt::format("{}", fmt::join(members, ","))));
  }
  std::optional<std::vector<char>> value;
  const auto members = [&] {
    try {
      return poll(key(round, "members"));
    } catch (const CommError& e) {
      ZEROTH_THROW(CommError,
                   "start {} of the job: node 0's launcher is out of reach, and the job cannot go on without it (it "
                   "hosts the stores): {}",
                   round + 1, e.what());
    }
  };
  for (const auto deadline = clock::now() + timeout_ + o_.last_call; !(value = members());) {
    if (stop()) return Joined::stopped;
    if (const auto failed = failure(round); failed && failed->final) {
      ZEROTH_THROW(CommError, "start {} of the job cannot go on: {}", round + 1, failed->cause);
    }
    if (clock::now() > deadline) {
      ZEROTH_THROW(CommError, "start {} of the job: node 0's launcher at {}:{} did not say which nodes take part within {} s",
                   round + 1, o_.master_addr, port_,
                   std::chrono::duration_cast<std::chrono::seconds>(timeout_ + o_.last_call).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  out = {};
  const std::string text(value->begin(), value->end());
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    out.members.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  const auto me = std::find(out.members.begin(), out.members.end(), o_.node_rank);
  if (me == out.members.end()) return Joined::late;
  out.index = static_cast<int>(me - out.members.begin());
  return Joined::yes;
}

void NodeRendezvous::fail(int round, const std::string& cause, bool final) {
  try {
    if (store_->add(key(round, "failures"), 1) == 1) {
      if (final) store_->set(key(round, "final"), bytes("1"));
      store_->set(key(round, "failed"), bytes(fmt::format("node {}: {}", o_.node_rank, cause)));
    }
  } catch (const CommError&) {
    // Node 0's launcher is gone; the other nodes' ranks learn of the failure from their peers.
  }
}

std::optional<NodeFailure> NodeRendezvous::failure(int round) {
  if (store_->broken()) return std::nullopt;
  try {
    const auto value = poll(key(round, "failed"));
    if (!value) return std::nullopt;
    return NodeFailure{std::string(value->begin(), value->end()), poll(key(round, "final")).has_value()};
  } catch (const CommError&) {
    return std::nullopt;
  }
}

}  // namespace zeroth::tools
