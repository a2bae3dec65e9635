// Streams and events of the CPU device: each stream is an in-order executor on its own thread.
#pragma once

#include <condition_variable>  // std::condition_variable
#include <cstdint>             // uint64_t
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
#include <set>                 // std::set
#include <thread>              // std::thread
#include <vector>              // std::vector

#include "core/device.h"

namespace zeroth {

class CpuEvent;
class CpuStream;

// The live streams of one device, so that the device can synchronize them all.
class StreamRegistry {
 public:
  void add(CpuStream* stream);
  void remove(CpuStream* stream);
  std::vector<CpuStream*> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::set<CpuStream*> streams_;
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(Device& device, StreamRegistry* registry = nullptr);
  // Runs every task already enqueued, then stops. An error nobody synchronized on is logged.
  ~CpuStream() override;

  Device& device() const override { return device_; }
  void wait(const Event& event) override;
  void synchronize() override;
  void enqueue_host(std::function<void()> fn) override { enqueue(std::move(fn)); }

  // Work: skipped while an earlier error has not been surfaced.
  void enqueue(std::function<void()> work);
  // Control: always runs and sees (and may set) the stream's pending error.
  void enqueue_control(std::function<void(std::exception_ptr&)> control);

 private:
  struct Task {
    std::function<void()> work;
    std::function<void(std::exception_ptr&)> control;
  };
  void push(Task task);
  void run();

  Device& device_;
  StreamRegistry* registry_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::condition_variable drained_;
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // first unsurfaced error; guarded by mutex_
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  CpuEvent();
  void record(Stream& stream) override;
  void synchronize() override;
  bool query() override;

 private:
  friend class CpuStream;
  struct State {
    std::mutex mutex;
    std::condition_variable completed_cv;
    uint64_t recorded = 0;
    uint64_t completed = 0;
    std::exception_ptr error;  // of the most recent completion
  };
  std::shared_ptr<State> state_;
};

}  // namespace zeroth
