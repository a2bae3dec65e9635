// Shared state of one local group: a reusable all-to-all exchange of small records (a barrier
// that also hands every rank everyone's record), point-to-point mailboxes, and abort.
#pragma once

#include <condition_variable>  // std::condition_variable
#include <deque>               // std::deque
#include <future>              // std::promise
#include <map>                 // std::map
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <string>              // std::string
#include <vector>              // std::vector

#include "comm/communicator.h"

namespace zeroth {

class LocalGroup {
 public:
  struct Record {
    Descriptor desc;
    TensorView buffer;  // the rank's send (or data) buffer
    // Marks the point in the rank's stream the others wait for. Shared: a peer that has finished
    // may destroy its communicator while a slower one is still about to wait on its event.
    std::shared_ptr<Event> event;
    std::shared_ptr<void> attachment;  // e.g. a scratch buffer or a new group for split
    int color = 0, key = 0;
  };

  struct Message {
    Descriptor desc;
    TensorView data;
    std::shared_ptr<Event> ready;
    std::shared_ptr<std::promise<std::shared_ptr<Event>>> done;
  };

  LocalGroup(int size, CommOptions options);

  int size() const { return size_; }
  // Blocks until every rank has contributed its record for this round, then returns all of them.
  // Throws CommError on timeout (naming the ranks that never arrived) or after abort().
  std::vector<Record> exchange(int rank, Record record);
  void post(int src, int dst, Message message);
  Message take(int src, int dst, const Descriptor& wanted);
  // Fails every pending and future exchange of this group and of groups split from it.
  void abort(const std::string& reason);
  void adopt_child(const std::shared_ptr<LocalGroup>& child);

 private:
  [[noreturn]] void throw_aborted_locked(int rank, const Descriptor& d) const;

  const int size_;
  const CommOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t round_ = 0;
  int arrived_ = 0;
  std::vector<Record> pending_, published_;
  std::vector<bool> present_;
  std::map<std::pair<int, int>, std::deque<Message>> mailboxes_;
  std::optional<std::string> aborted_;
  std::vector<std::weak_ptr<LocalGroup>> children_;
};

}  // namespace zeroth
