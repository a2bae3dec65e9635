// CPU streams and events.
#include "core/cpu/cpu_stream.h"

#include <utility>  // std::exchange

#include "core/error.h"
#include "core/log.h"

namespace zeroth {

void StreamRegistry::add(CpuStream* stream) {
  std::lock_guard lock(mutex_);
  streams_.insert(stream);
}

void StreamRegistry::remove(CpuStream* stream) {
  std::lock_guard lock(mutex_);
  streams_.erase(stream);
}

std::vector<CpuStream*> StreamRegistry::snapshot() const {
  std::lock_guard lock(mutex_);
  return {streams_.begin(), streams_.end()};
}

CpuStream::CpuStream(Device& device, StreamRegistry* registry) : device_(device), registry_(registry), worker_([this] { run(); }) {
  if (registry_ != nullptr) registry_->add(this);
}

CpuStream::~CpuStream() {
  if (registry_ != nullptr) registry_->remove(this);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  worker_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      ZLOG_ERROR("a {} stream was destroyed with an error nobody synchronized on: {}", device_.name(), e.what());
    } catch (...) {
      ZLOG_ERROR("a {} stream was destroyed with an unknown error nobody synchronized on", device_.name());
    }
  }
}

void CpuStream::push(Task task) {
  {
    std::lock_guard lock(mutex_);
    ZEROTH_CHECK(!stopping_, "enqueue on a stream that is being destroyed");
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  queued_.notify_one();
}

void CpuStream::enqueue(std::function<void()> work) { push(Task{std::move(work), {}}); }

void CpuStream::enqueue_control(std::function<void(std::exception_ptr&)> control) { push(Task{{}, std::move(control)}); }

void CpuStream::run() {
  for (;;) {
    Task task;
    std::exception_ptr error;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      error = error_;
    }
    if (task.control) {
      task.control(error);
    } else if (!error) {
      try {
        task.work();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = error;
      // Dropped under the lock: the exception's last owner is then the thread that takes error_
      // in synchronize(), ordered after this by the mutex (its reference count alone is not
      // visible to ThreadSanitizer).
      error = nullptr;
      ++completed_;
    }
    drained_.notify_all();
  }
}

void CpuStream::synchronize() {
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    const uint64_t target = enqueued_;
    drained_.wait(lock, [&] { return completed_ >= target; });
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void CpuStream::wait(const Event& event) {
  const auto* cpu_event = dynamic_cast<const CpuEvent*>(&event);
  ZEROTH_CHECK(cpu_event != nullptr, "a {} stream can only wait on CPU events", device_.name());
  auto state = cpu_event->state_;
  uint64_t target;
  {
    std::lock_guard lock(state->mutex);
    target = state->recorded;
  }
  if (target == 0) return;
  enqueue_control([state, target](std::exception_ptr& error) {
    std::unique_lock lock(state->mutex);
    state->completed_cv.wait(lock, [&] { return state->completed >= target; });
    if (!error && state->error) error = state->error;  // the producer failed: so does this stream
  });
}

CpuEvent::CpuEvent() : state_(std::make_shared<State>()) {}

void CpuEvent::record(Stream& stream) {
  auto* cpu_stream = dynamic_cast<CpuStream*>(&stream);
  ZEROTH_CHECK(cpu_stream != nullptr, "a CPU event can only be recorded on a CPU stream");
  uint64_t target;
  {
    std::lock_guard lock(state_->mutex);
    target = ++state_->recorded;
  }
  cpu_stream->enqueue_control([state = state_, target](std::exception_ptr& error) {
    {
      std::lock_guard lock(state->mutex);
      if (target >= state->completed) {
        state->completed = target;
        state->error = error;
      }
    }
    state->completed_cv.notify_all();
  });
}

void CpuEvent::synchronize() {
  std::unique_lock lock(state_->mutex);
  const uint64_t target = state_->recorded;
  state_->completed_cv.wait(lock, [&] { return state_->completed >= target; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool CpuEvent::query() {
  std::lock_guard lock(state_->mutex);
  return state_->completed >= state_->recorded;
}

}  // namespace zeroth
