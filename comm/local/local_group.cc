// The local group's exchange, mailboxes and abort.
#include "comm/local/local_group.h"

#include "core/error.h"

namespace zeroth {

LocalGroup::LocalGroup(int size, CommOptions options)
    : size_(size), options_(std::move(options)), pending_(size), present_(size, false) {}

void LocalGroup::throw_aborted_locked(int rank, const Descriptor& d) const {
  ZEROTH_THROW(CommError, "local {} on rank {} of {} aborted: {}", d.describe(), rank, size_, *aborted_);
}

std::vector<LocalGroup::Record> LocalGroup::exchange(int rank, Record record) {
  std::unique_lock lock(mutex_);
  if (aborted_) throw_aborted_locked(rank, record.desc);
  const uint64_t round = round_;
  pending_[rank] = std::move(record);
  present_[rank] = true;
  if (++arrived_ == size_) {
    published_ = pending_;
    std::fill(present_.begin(), present_.end(), false);
    arrived_ = 0;
    ++round_;
    changed_.notify_all();
    return published_;
  }
  const Descriptor desc = pending_[rank].desc;
  const bool done = changed_.wait_for(lock, options_.timeout, [&] { return round_ != round || aborted_; });
  if (round_ != round) return published_;  // completed, even if an abort came right after
  if (aborted_) throw_aborted_locked(rank, desc);
  std::string missing;
  for (int r = 0; r < size_; ++r) {
    if (!present_[r]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
  }
  (void)done;
  ZEROTH_THROW(CommError,
               "local {} on rank {} of {}: timed out after {} s waiting for rank(s) {}, which never issued it "
               "(a rank died, hangs, or issues collectives in a different order; ZEROTH_COMM_TIMEOUT sets the wait)",
               desc.describe(), rank, size_, options_.timeout.count() / 1000.0, missing);
}

void LocalGroup::post(int src, int dst, Message message) {
  std::lock_guard lock(mutex_);
  if (aborted_) throw_aborted_locked(src, message.desc);
  mailboxes_[{src, dst}].push_back(std::move(message));
  changed_.notify_all();
}

LocalGroup::Message LocalGroup::take(int src, int dst, const Descriptor& wanted) {
  std::unique_lock lock(mutex_);
  auto& box = mailboxes_[{src, dst}];
  const bool arrived = changed_.wait_for(lock, options_.timeout, [&] { return !box.empty() || aborted_; });
  if (aborted_) throw_aborted_locked(dst, wanted);
  if (!arrived) {
    ZEROTH_THROW(CommError, "local {} on rank {} of {}: timed out after {} s waiting for rank {} to send", wanted.describe(), dst,
                 size_, options_.timeout.count() / 1000.0, src);
  }
  Message message = std::move(box.front());
  box.pop_front();
  return message;
}

void LocalGroup::abort(const std::string& reason) {
  std::vector<std::shared_ptr<LocalGroup>> children;
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    aborted_ = reason;
    // Senders waiting for a receiver that will not come learn it now.
    for (auto& [pair, box] : mailboxes_) {
      for (auto& m : box) {
        m.done->set_exception(
            std::make_exception_ptr(CommError(fmt::format("local {} from rank {} to rank {} of {} aborted: {}", m.desc.describe(),
                                                          pair.first, pair.second, size_, reason))));
      }
      box.clear();
    }
    for (auto& weak : children_) {
      if (auto child = weak.lock()) children.push_back(std::move(child));
    }
    changed_.notify_all();
  }
  for (auto& child : children) child->abort(reason);
}

void LocalGroup::adopt_child(const std::shared_ptr<LocalGroup>& child) {
  std::lock_guard lock(mutex_);
  children_.push_back(child);
  if (aborted_) child->abort(*aborted_);
}

}  // namespace zeroth
