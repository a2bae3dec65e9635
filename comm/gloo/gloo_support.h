// What the Gloo communicators of one job share and use: Gloo's store over zeroth's TCP store, the
// job's shared resources, reusable scratch, and the transport's address. Internal to comm/gloo.
#pragma once

#include <chrono>   // std::chrono::milliseconds
#include <cstddef>  // size_t
#include <memory>   // std::unique_ptr, std::shared_ptr
#include <mutex>    // std::mutex
#include <string>   // std::string
#include <vector>   // std::vector

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/rendezvous.h"  // RendezvousInfo
#include "comm/tcp_store.h"   // TcpStore, JobStore

namespace zeroth::gloo_detail {

// Gloo's store interface over our TCP store, with a key prefix per context.
class PrefixedStore final : public gloo::rendezvous::Store {
 public:
  PrefixedStore(TcpStore& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_.wait(full, timeout);
  }

 private:
  TcpStore& store_;
  std::string prefix_;
};

// Resources every communicator of one job shares. Members are destroyed bottom-up: the store
// server (on rank 0) goes last and waits for the other ranks to disconnect.
struct Shared {
  // Buffers of failed ops (see BufferKeeper) are never freed: Gloo's I/O thread can still
  // signal them while its pairs wind down, at a time no owner here controls. A failed job is on
  // its way out, so the few hundred bytes each are left to the process's exit.
  ~Shared() {
    for (auto& b : abandoned) static_cast<void>(b.release());
  }
  JobStore job;
  TcpStore* store = nullptr;
  std::mutex abandoned_mutex;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> abandoned;
  std::shared_ptr<gloo::transport::Device> device;
  // The first failed op of any communicator of the job: ops that start after it fail at once
  // instead of each waiting out the timeout for a peer that is gone.
  void note_failure(const std::string& what) {
    std::lock_guard lock(failure_mutex);
    if (failure.empty()) failure = what;
  }
  std::string first_failure() {
    std::lock_guard lock(failure_mutex);
    return failure;
  }

 private:
  std::mutex failure_mutex;
  std::string failure;
};

// Scratch of an operation that failed: Gloo's I/O thread may still receive into it after the
// wait threw, so it is kept (reachable, not leaked) until the process, which is failing, exits.
void abandon_scratch(std::vector<float> v);

// Reusable f32 scratch: collectives run every step with the same sizes, so the pages are touched
// once, not on every call.
class ScratchPool {
 public:
  class Lease {
   public:
    Lease(ScratchPool& pool, std::vector<float> v) : pool_(pool), v_(std::move(v)) {}
    ~Lease() {
      if (std::uncaught_exceptions() > exceptions_) {
        abandon_scratch(std::move(v_));
      } else {
        pool_.give_back(std::move(v_));
      }
    }
    float* data() { return v_.data(); }

   private:
    ScratchPool& pool_;
    std::vector<float> v_;
    int exceptions_ = std::uncaught_exceptions();
  };
  Lease take(size_t n) {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() >= n) {
        auto v = std::move(*it);
        free_.erase(it);
        return Lease(*this, std::move(v));
      }
    }
    return Lease(*this, std::vector<float>(std::max<size_t>(n, 1)));
  }

 private:
  void give_back(std::vector<float> v) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(v));
  }
  std::mutex mutex_;
  std::vector<std::vector<float>> free_;
};

// One failure cascades: a rank whose peer died fails, then its own peers do. Every failing rank
// posts (under `prefix` in the store) which peer it saw fail; after a grace period, the peers
// that others saw fail but that posted nothing themselves are the ones that died or stalled.
// Returns "; the rank(s) that died or stalled: ..." naming them (or that the store is gone, or
// nothing), for the failing rank's error.
std::string name_lost_ranks(TcpStore& store, const std::string& prefix, int rank, int size, int peer, const std::string& what);

// The job's Gloo context of every rank ("world/" in the store), its pairs connected. CommError
// when it fails; after a timeout it names the ranks that never arrived.
std::shared_ptr<gloo::Context> connect_world(Shared& shared, const RendezvousInfo& info, std::chrono::milliseconds timeout);

// The host address other ranks can reach this one at: loopback for a local master, else the
// interface the kernel would route to the master through.
gloo::transport::tcp::attr transport_attr(const RendezvousInfo& info);

}  // namespace zeroth::gloo_detail
