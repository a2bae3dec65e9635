// The launchers of a multi-node job that restarts (`zeroth launch --max-restarts`, or
// `--nnodes MIN:MAX`) agree, before each start, on which nodes take part, and tell each other
// when a start fails. The launcher of node 0 (at --master-addr) hosts a store of its own at
// --master-port, behind the job's token; the ranks' store of start k is at --master-port + 1 + k.
#pragma once

#include <chrono>    // std::chrono::milliseconds
#include <memory>    // std::unique_ptr
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "comm/tcp_store.h"  // TcpStore, TcpStoreServer

namespace zeroth::tools {

struct LaunchOptions;

// One start's nodes: the node ranks taking part, in order; this node's place among them.
struct NodeRound {
  std::vector<int> members;
  int index = 0;
};

class NodeRendezvous {
 public:
  // The store at o.master_addr:`port`. `timeout`: how long a launcher waits for node 0's store,
  // and node 0 for MIN nodes to join.
  NodeRendezvous(const LaunchOptions& o, int port, const std::string& token, std::chrono::milliseconds timeout);
  ~NodeRendezvous();

  // Joins start `round`. Node 0 closes it once every node joined, or MIN did and the last call
  // passed without another; CommError when fewer than MIN joined within the timeout, naming the
  // missing. nullopt when this node joined after it closed (it then takes no part).
  std::optional<NodeRound> join(int round);
  // Tells the other launchers start `round` failed here, and why (the first cause stays).
  void fail(int round, const std::string& cause);
  // Another node's cause, when start `round` failed there; never waits. nullopt too when node 0's
  // store is gone (its launcher ended): the ranks' own connections report that.
  std::optional<std::string> failure(int round);

 private:
  std::vector<int> decide(int round);

  const LaunchOptions& o_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> store_;
};

}  // namespace zeroth::tools
