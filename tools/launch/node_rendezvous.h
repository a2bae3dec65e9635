// The launchers of a multi-node job that restarts (`zeroth launch --max-restarts`, or
// `--nnodes MIN:MAX`) agree, before each start, on which nodes take part, and tell each other
// when a start fails. The launcher of node 0 (at --master-addr) hosts a store of its own at
// --master-port, behind the job's token; the ranks' store of start k is at --master-port + 1 + k.
#pragma once

#include <chrono>      // std::chrono::milliseconds
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include "comm/tcp_store.h"  // TcpStore, TcpStoreServer

namespace zeroth::tools {

struct LaunchOptions;

// One start's nodes: the node ranks taking part, in order; this node's place among them.
struct NodeRound {
  std::vector<int> members;
  int index = 0;
};

// How a start failed on another node: its cause, and whether the job is to end there (a signal
// to that node's launcher) rather than start again.
struct NodeFailure {
  std::string cause;
  bool final = false;
};

class NodeRendezvous {
 public:
  // The store at o.master_addr:`port`. `timeout`: how long a launcher waits for node 0's store,
  // and node 0 for MIN nodes to join.
  NodeRendezvous(const LaunchOptions& o, int port, const std::string& token, std::chrono::milliseconds timeout);
  ~NodeRendezvous();

  enum class Joined { yes, late, stopped };
  // Joins start `round`, asking `stop` (a signal to the launcher) every 100 ms while it waits.
  // Node 0 closes the start once every node joined, or MIN did and the last call passed without
  // another; CommError when fewer than MIN joined within the timeout, naming the missing. `late`:
  // this node joined after it closed, and takes no part.
  Joined join(int round, const std::function<bool()>& stop, NodeRound& out);
  // Tells the other launchers start `round` failed here, and why (the first cause stays); `final`:
  // the job ends rather than starting again.
  void fail(int round, const std::string& cause, bool final);
  // Another node's report, when start `round` failed there. Waits at most a second for node 0's
  // store; nullopt also when it does not answer (its launcher ended, or the link is down): the
  // ranks' own connections report that.
  std::optional<NodeFailure> failure(int round);

 private:
  std::vector<int> decide(int round, const std::function<bool()>& stop);
  std::optional<std::vector<char>> poll(const std::string& key);

  const LaunchOptions& o_;
  int port_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> store_;
};

}  // namespace zeroth::tools
