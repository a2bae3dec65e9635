// Local collectives. Every op follows one shape: each rank marks its stream with an event and
// exchanges (buffer, event) records with the others; its stream then waits for everyone's
// event, runs its share of the copies or reductions reading the peers' buffers directly, and
// marks a second event that everyone waits for before touching those buffers again.
#include "comm/local/local_comm.h"

#include <thread>  // std::thread, sleep_until

#include "comm/local/local_group.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank, CommOptions options)
      : Communicator(std::move(options)), group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string_view backend() const override { return "local"; }
  LocalGroup& group() { return *group_; }
  void abort(const std::string& reason) override { group_->abort(reason); }

 protected:
  void do_all_gather(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    auto all = arrive(s, d, send, recv.bytes());
    const size_t bytes = send.bytes();
    for (int p = 0; p < size(); ++p) {
      void* dst = static_cast<char*>(recv.data) + p * bytes;
      if (dst != all[p].buffer.data) s.device().copy(s, dst, all[p].buffer.data, bytes);
    }
    depart(s, d);
  }

  void do_reduce_scatter(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    auto all = arrive(s, d, send, send.bytes());
    std::vector<TensorView> inputs;
    for (int p = 0; p < size(); ++p) inputs.push_back(all[p].buffer.slice(rank_ * recv.numel, recv.numel));
    reduce(s, recv, inputs, d.reduce);
    depart(s, d);
  }

  // Phase 1: rank r reduces chunk r of everyone's data into its own data, in place (nobody else
  // reads chunk r of rank r's data). Phase 2: rank r copies every other reduced chunk p from
  // rank p's data (nobody else writes it any more, and nobody reads the chunks r writes).
  void do_all_reduce(Stream& s, TensorView data, const Descriptor& d) override {
    auto all = arrive(s, d, data, 2 * data.bytes());
    const size_t n = size(), chunk = (data.numel + n - 1) / n;
    auto range = [&](size_t p) {
      const size_t begin = std::min(data.numel, p * chunk);
      return std::pair{begin, std::min(data.numel, begin + chunk) - begin};
    };
    const auto [my_begin, my_len] = range(rank_);
    if (my_len > 0) {
      std::vector<TensorView> inputs;
      for (size_t p = 0; p < n; ++p) inputs.push_back(all[p].buffer.slice(my_begin, my_len));
      reduce(s, data.slice(my_begin, my_len), inputs, d.reduce);
    }
    sync_point(s, d, data, nullptr, &middle_);
    for (size_t p = 0; p < n; ++p) {
      const auto [begin, len] = range(p);
      if (p != static_cast<size_t>(rank_) && len > 0) {
        s.device().copy(s, data.slice(begin, len).data, all[p].buffer.slice(begin, len).data, len * dtype_size(data.dtype));
      }
    }
    depart(s, d);
  }

  void do_broadcast(Stream& s, TensorView data, const Descriptor& d) override {
    auto all = arrive(s, d, data, data.bytes());
    if (rank_ != d.root && data.numel > 0) s.device().copy(s, data.data, all[d.root].buffer.data, data.bytes());
    depart(s, d);
  }

  void do_barrier(Stream& s, const Descriptor& d) override { arrive(s, d, {}, 0); }

  // Every rank copies what its peers send it straight out of their send buffers.
  void do_all_to_all(Stream& s, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) override {
    size_t sending = 0;
    for (int p = 0; p < size(); ++p) sending += p == rank_ ? 0 : splits.send_counts[p];
    // The link model charges (n - 1) / n of the logical bytes: what leaves this rank is `sending`.
    auto all = arrive(s, d, send, sending * dtype_size(send.dtype) * size() / std::max(size() - 1, 1));
    for (int p = 0; p < size(); ++p) {
      const size_t count = splits.recv_counts[p];
      if (count == 0) continue;
      const TensorView from = all[p].buffer.slice(splits.peer_offsets[p], count);
      s.device().copy(s, recv.slice(splits.recv_offsets[p], count).data, from.data, from.bytes());
    }
    depart(s, d);
  }

  std::vector<uint64_t> do_gather_rows(Stream&, std::span<const uint64_t> row, const Descriptor& d) override {
    LocalGroup::Record mine;
    mine.desc = d;
    mine.attachment = std::make_shared<std::vector<uint64_t>>(row.begin(), row.end());
    auto all = group_->exchange(rank_, std::move(mine));
    check_all(all, d);
    std::vector<uint64_t> rows;
    for (int p = 0; p < size(); ++p) {
      const auto& theirs = *std::static_pointer_cast<std::vector<uint64_t>>(all[p].attachment);
      ZEROTH_CHECK(theirs.size() == row.size(), "local {}: rank {} exchanged {} counts, rank {} {}", d.describe(), rank_, row.size(),
                   p, theirs.size());
      rows.insert(rows.end(), theirs.begin(), theirs.end());
    }
    return rows;
  }

  void do_send(Stream& s, TensorView data, const Descriptor& d) override {
    auto ready = std::shared_ptr<Event>(s.device().create_event());
    ready->record(s);
    auto done = std::make_shared<std::promise<std::shared_ptr<Event>>>();
    auto done_future = done->get_future();
    group_->post(rank_, d.root, {d, data, ready, done});
    // Rendezvous: the sender's stream may reuse the buffer only after the receiver copied it.
    if (done_future.wait_for(options_.timeout) != std::future_status::ready) {
      ZEROTH_THROW(CommError, "local {} on rank {} of {}: timed out after {} s waiting for rank {} to receive", d.describe(), rank_,
                   size(), options_.timeout.count() / 1000.0, d.root);
    }
    s.wait(*done_future.get());
  }

  void do_recv(Stream& s, TensorView data, const Descriptor& d) override {
    auto message = group_->take(d.root, rank_, d);
    if (message.desc.count != d.count || message.desc.dtype != d.dtype) {
      auto error = std::make_exception_ptr(CommError(fmt::format("local send/recv mismatch: rank {} sent {} but rank {} posted {}",
                                                                 d.root, message.desc.describe(), rank_, d.describe())));
      message.done->set_exception(error);
      std::rethrow_exception(error);
    }
    s.wait(*message.ready);
    if (data.numel > 0) s.device().copy(s, data.data, message.data.data, data.bytes());
    auto done = std::shared_ptr<Event>(s.device().create_event());
    done->record(s);
    message.done->set_value(std::move(done));
  }

  std::unique_ptr<Communicator> do_split(int color, int key, const Descriptor& d) override {
    LocalGroup::Record mine;
    mine.desc = d;
    mine.color = color;
    mine.key = key;
    auto all = group_->exchange(rank_, mine);
    check_all(all, d);
    std::vector<int> members;
    for (int p = 0; p < size(); ++p) {
      if (all[p].color == color) members.push_back(p);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
    // The first member of each new group creates it; a second round hands it to the rest.
    LocalGroup::Record offer;
    offer.desc = d;
    if (color >= 0 && members.front() == rank_) {
      auto child = std::make_shared<LocalGroup>(static_cast<int>(members.size()), options_);
      group_->adopt_child(child);
      offer.attachment = child;
    }
    auto offers = group_->exchange(rank_, offer);
    if (color < 0) return nullptr;
    auto child = std::static_pointer_cast<LocalGroup>(offers[members.front()].attachment);
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    return std::make_unique<LocalCommunicator>(std::move(child), new_rank, options_);
  }

 private:
  void check_all(const std::vector<LocalGroup::Record>& all, const Descriptor& d) const {
    for (int p = 0; p < size(); ++p) check_same(d, rank_, all[p].desc, p, "local");
  }

  std::shared_ptr<Event>& event(Stream& s, std::shared_ptr<Event>& slot) {
    if (!slot || event_device_ != &s.device()) {
      ready_ = s.device().create_event();
      middle_ = s.device().create_event();
      done_ = s.device().create_event();
      event_device_ = &s.device();
    }
    return slot;
  }

  // Marks this rank's stream, exchanges records, and makes the stream wait for every peer.
  std::vector<LocalGroup::Record> sync_point(Stream& s, const Descriptor& d, TensorView buffer, std::shared_ptr<void> attachment,
                                             std::shared_ptr<Event>* which = nullptr) {
    auto& slot = which ? *which : done_;
    const auto& e = event(s, slot);
    e->record(s);
    LocalGroup::Record mine{d, buffer, e, std::move(attachment)};
    auto all = group_->exchange(rank_, std::move(mine));
    check_all(all, d);
    for (int p = 0; p < size(); ++p) {
      if (p != rank_) s.wait(*all[p].event);
    }
    return all;
  }

  std::vector<LocalGroup::Record> arrive(Stream& s, const Descriptor& d, TensorView buffer, uint64_t logical_bytes) {
    auto all = sync_point(s, d, buffer, nullptr, &ready_);
    if (options_.link.holds(d.op)) {
      // The modeled transfer starts once every rank's data is ready and ends no earlier than a
      // link of this latency and bandwidth would allow.
      const auto duration = modeled_time(size() <= 1 ? 0 : logical_bytes * (size() - 1) / size());
      auto start = std::make_shared<std::chrono::steady_clock::time_point>();
      s.enqueue_host([start] { *start = std::chrono::steady_clock::now(); });
      link_deadline_ = [start, duration] { std::this_thread::sleep_until(*start + duration); };
      if (d.op == CollectiveOp::barrier) finish_link_model(s);
    }
    return all;
  }

  void finish_link_model(Stream& s) {
    if (link_deadline_) s.enqueue_host(std::move(link_deadline_));
    link_deadline_ = nullptr;
  }

  void depart(Stream& s, const Descriptor& d) {
    finish_link_model(s);
    sync_point(s, d, {}, nullptr);
  }

  void reduce(Stream& s, TensorView out, const std::vector<TensorView>& inputs, ReduceOp op) {
    const float scale = op == ReduceOp::avg ? 1.0f / static_cast<float>(size()) : 1.0f;
    s.device().reduce(s, out, inputs, op == ReduceOp::max ? ReduceKind::max : ReduceKind::sum, scale);
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  Device* event_device_ = nullptr;
  // One event per sync point of an op, so a fast peer re-recording one cannot be confused with
  // another that a slow rank has yet to wait for.
  std::shared_ptr<Event> ready_, middle_, done_;
  std::function<void()> link_deadline_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size, CommOptions options) {
  ZEROTH_CHECK(size >= 1, "a local group needs at least one rank, got {}", size);
  auto group = std::make_shared<LocalGroup>(size, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalCommunicator>(group, r, options));
  return comms;
}

void run_local_ranks(int size, const std::function<void(Communicator&)>& fn, CommOptions options) {
  auto comms = make_local_communicators(size, options);
  auto& group = static_cast<LocalCommunicator&>(*comms[0]).group();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      log::set_thread_rank(r);
      try {
        fn(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        group.abort(fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        errors[r] = std::current_exception();
        group.abort(fmt::format("rank {} failed with an unknown error", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  // The rank that failed first is the one whose error is not an abort notice.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommError& ce) {
      if (std::string_view(ce.what()).find("aborted: rank") != std::string_view::npos) {
        if (!first) first = e;
        continue;
      }
      std::rethrow_exception(e);
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zeroth
