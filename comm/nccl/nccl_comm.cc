// NCCL collectives. Communicators are non-blocking (config.blocking = 0): every call is followed
// by a bounded wait on ncclCommGetAsyncError, so neither initialization nor a dead peer can hang
// a rank past the timeout; a watchdog thread does the same for ops already on a stream.
#include "comm/nccl/nccl_comm.h"

#include "core/error.h"

#ifdef ZEROTH_WITH_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/tcp_store.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_info.h"
#include "core/log.h"

namespace zeroth {

namespace {

using clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// Waits (bounded) until a non-blocking communicator has finished the call just made.
void settle(ncclComm_t comm, ncclResult_t rc, const std::string& what, std::chrono::milliseconds timeout) {
  const auto deadline = clock::now() + timeout;
  while (rc == ncclInProgress) {
    if (clock::now() > deadline) {
      ncclCommAbort(comm);
      ZEROTH_THROW(CommError, "{}: not finished after {} s; the communicator was aborted (a peer died or never arrived?)", what,
                   timeout.count() / 1000.0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (ncclCommGetAsyncError(comm, &rc) != ncclSuccess) break;
  }
  if (rc != ncclSuccess) {
    const char* last = ncclGetLastError(comm);
    ZEROTH_THROW(CommError, "{} failed: {} ({})", what, ncclGetErrorString(rc), last ? last : "no detail");
  }
}

// Aborts a communicator whose op has not completed within the timeout, so that the ranks'
// stream synchronizations fail instead of hanging (torch's NCCL watchdog does the same).
class Watchdog {
 public:
  Watchdog(ncclComm_t comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout), thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
    for (auto& w : pending_) cudaEventDestroy(w.event);
  }

  void watch(cudaStream_t stream, std::string what, int device) {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event, stream));
    std::lock_guard lock(mutex_);
    pending_.push_back({event, clock::now() + timeout_, std::move(what), device});
    changed_.notify_all();
  }

 private:
  struct Watched {
    cudaEvent_t event;
    clock::time_point deadline;
    std::string what;
    int device;
  };

  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      changed_.wait_for(lock, std::chrono::milliseconds(50));
      while (!pending_.empty()) {
        auto& w = pending_.front();
        cudaSetDevice(w.device);
        const cudaError_t state = cudaEventQuery(w.event);
        if (state == cudaSuccess) {
          cudaEventDestroy(w.event);
          pending_.pop_front();
          continue;
        }
        if (state != cudaErrorNotReady || clock::now() > w.deadline) {
          ZLOG_ERROR("nccl watchdog: {} did not complete within {} s ({}); aborting the communicator", w.what,
                     timeout_.count() / 1000.0, state == cudaErrorNotReady ? "still running" : cudaGetErrorString(state));
          ncclCommAbort(comm_);
          stop_ = true;
        }
        break;
      }
    }
  }

  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Watched> pending_;
  bool stop_ = false;
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<JobStore> job, ncclComm_t comm, int gpu, CommOptions options)
      : Communicator(std::move(options)), job_(std::move(job)), comm_(comm), gpu_(gpu) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
    watchdog_ = std::make_unique<Watchdog>(comm_, options_.timeout);
  }
  ~NcclCommunicator() override {
    watchdog_.reset();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (desync_buffer_ != nullptr) cudaFree(desync_buffer_);
    if (rows_device_ != nullptr) cudaFree(rows_device_);
    if (rows_host_ != nullptr) cudaFreeHost(rows_host_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

 protected:
  void do_all_gather(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) { return ncclAllGather(send.data, recv.data, send.numel, nccl_type(d.dtype), comm_, st); });
  }
  void do_reduce_scatter(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) {
      return ncclReduceScatter(send.data, recv.data, recv.numel, nccl_type(d.dtype), nccl_op(d.reduce), comm_, st);
    });
  }
  void do_all_reduce(Stream& s, TensorView data, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) {
      return ncclAllReduce(data.data, data.data, data.numel, nccl_type(d.dtype), nccl_op(d.reduce), comm_, st);
    });
  }
  void do_broadcast(Stream& s, TensorView data, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) { return ncclBroadcast(data.data, data.data, data.numel, nccl_type(d.dtype), d.root, comm_, st); });
  }
  void do_send(Stream& s, TensorView data, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) { return ncclSend(data.data, data.numel, nccl_type(d.dtype), d.root, comm_, st); });
  }
  void do_recv(Stream& s, TensorView data, const Descriptor& d) override {
    run(s, d, [&](cudaStream_t st) { return ncclRecv(data.data, data.numel, nccl_type(d.dtype), d.root, comm_, st); });
  }
  // NCCL has no barrier: an all-reduce of one float orders every rank's stream behind it.
  void do_barrier(Stream& s, const Descriptor& d) override {
    if (scratch_ == nullptr) {
      CudaDeviceGuard guard(gpu_);
      CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    }
    run(s, d, [&](cudaStream_t st) { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, st); });
  }
  // Grouped point-to-point calls, which NCCL runs as one op (nccl-tests' alltoall does the same).
  void do_all_to_all(Stream& s, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) override {
    const size_t esize = dtype_size(send.dtype);
    auto at = [esize](TensorView v, size_t offset) { return static_cast<char*>(v.data) + offset * esize; };
    run(s, d, [&](cudaStream_t st) {
      ncclResult_t rc = ncclGroupStart();
      if (rc != ncclSuccess) return rc;
      for (int p = 0; p < size_; ++p) {
        if (splits.send_counts[p] > 0) {
          rc = ncclSend(at(send, splits.send_offsets[p]), splits.send_counts[p], nccl_type(d.dtype), p, comm_, st);
          if (rc != ncclSuccess && rc != ncclInProgress) break;
        }
        if (splits.recv_counts[p] > 0) {
          rc = ncclRecv(at(recv, splits.recv_offsets[p]), splits.recv_counts[p], nccl_type(d.dtype), p, comm_, st);
          if (rc != ncclSuccess && rc != ncclInProgress) break;
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return rc != ncclSuccess && rc != ncclInProgress ? rc : end;
    });
  }

  // The rows travel through the GPU: gathered on the stream, which the host then waits for. The
  // buffers stay from one call to the next: a cudaMalloc or cudaFree would synchronize the device,
  // stalling (or, with NCCL kernels of other communicators in flight, deadlocking) its streams.
  std::vector<uint64_t> do_gather_rows(Stream& s, std::span<const uint64_t> row, const Descriptor& d) override {
    const size_t bytes = row.size() * sizeof(uint64_t), total = bytes * size_;
    CudaDeviceGuard guard(gpu_);
    if (rows_capacity_ < total) {
      if (rows_device_ != nullptr) CUDA_CHECK(cudaFree(rows_device_));
      if (rows_host_ != nullptr) CUDA_CHECK(cudaFreeHost(rows_host_));
      rows_device_ = rows_host_ = nullptr;
      rows_capacity_ = 0;
      CUDA_CHECK(cudaMalloc(&rows_device_, total));
      CUDA_CHECK(cudaMallocHost(&rows_host_, total));
      rows_capacity_ = total;
    }
    auto* mine_host = static_cast<uint64_t*>(rows_host_) + rank_ * row.size();
    std::copy(row.begin(), row.end(), mine_host);
    auto* mine = static_cast<char*>(rows_device_) + rank_ * bytes;
    auto* cuda_stream = static_cast<CudaStream*>(&s);
    const std::string what = fmt::format("nccl {} on rank {} of {} (count exchange)", d.describe(), rank_, size_);
    run(s, d, [&](cudaStream_t st) {
      if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(mine, mine_host, bytes, cudaMemcpyHostToDevice, st));
      return ncclAllGather(mine, rows_device_, row.size(), ncclUint64, comm_, st);
    });
    CUDA_CHECK(cudaMemcpyAsync(rows_host_, rows_device_, total, cudaMemcpyDeviceToHost, cuda_stream->handle()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream->handle()));
    // An aborted communicator's kernels end without data: what landed then is not the peers' rows.
    check_not_aborted(what);
    const auto* all = static_cast<const uint64_t*>(rows_host_);
    return std::vector<uint64_t>(all, all + row.size() * size_);
  }

  std::unique_ptr<Communicator> do_split(int color, int key, const Descriptor& d) override {
    CudaDeviceGuard guard(gpu_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const ncclResult_t rc = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    settle(comm_, rc, fmt::format("nccl {} on rank {} of {}", d.describe(), rank_, size_), options_.timeout);
    if (child == nullptr) return nullptr;
    ncclResult_t child_state = ncclInProgress;
    ncclCommGetAsyncError(child, &child_state);
    settle(child, child_state, fmt::format("nccl {} (new communicator) on rank {}", d.describe(), rank_), options_.timeout);
    return std::make_unique<NcclCommunicator>(job_, child, gpu_, options_);
  }

 private:
  template <class Call>
  void run(Stream& s, const Descriptor& d, Call&& call) {
    auto* cuda_stream = dynamic_cast<CudaStream*>(&s);
    ZEROTH_CHECK(cuda_stream != nullptr,
                 "the nccl backend runs on CUDA streams; got a stream of {} (use the gloo or local backend on the CPU)",
                 s.device().name());
    CudaDeviceGuard guard(gpu_);
    const std::string what = fmt::format("nccl {} on rank {} of {}", d.describe(), rank_, size_);
    if (options_.check_desync) check_desync(cuda_stream->handle(), d, what);
    settle(comm_, call(cuda_stream->handle()), what, options_.timeout);
    watchdog_->watch(cuda_stream->handle(), what, gpu_);
  }

  void check_not_aborted(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      ZEROTH_THROW(CommError, "{}: the communicator failed ({}; a peer died, or the watchdog aborted it after {} s)", what,
                   ncclGetErrorString(rc != ncclSuccess ? rc : state), options_.timeout.count() / 1000.0);
    }
  }

  // Debug mode: every rank's descriptor is all-gathered (and waited for) before the op itself.
  struct WireDescriptor {
    uint64_t sequence, count;
    int32_t root;
    uint8_t op, dtype, reduce, pad;
  };
  void check_desync(cudaStream_t stream, const Descriptor& d, const std::string& what) {
    const size_t bytes = sizeof(WireDescriptor) * size_;
    if (desync_buffer_ == nullptr) CUDA_CHECK(cudaMalloc(&desync_buffer_, bytes));
    std::vector<WireDescriptor> all(size_);
    all[rank_] = {
        d.sequence, d.count, d.root, static_cast<uint8_t>(d.op), static_cast<uint8_t>(d.dtype), static_cast<uint8_t>(d.reduce), 0};
    auto* mine = static_cast<char*>(desync_buffer_) + rank_ * sizeof(WireDescriptor);
    CUDA_CHECK(cudaMemcpyAsync(mine, &all[rank_], sizeof(WireDescriptor), cudaMemcpyHostToDevice, stream));
    settle(comm_, ncclAllGather(mine, desync_buffer_, sizeof(WireDescriptor), ncclUint8, comm_, stream), what + " (desync check)",
           options_.timeout);
    CUDA_CHECK(cudaMemcpyAsync(all.data(), desync_buffer_, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    check_not_aborted(what + " (desync check)");
    for (int p = 0; p < size_; ++p) {
      const auto& w = all[p];
      check_same(d, rank_,
                 {w.sequence, static_cast<CollectiveOp>(w.op), w.count, static_cast<DType>(w.dtype), static_cast<ReduceOp>(w.reduce),
                  w.root},
                 p, "nccl");
    }
  }

  std::shared_ptr<JobStore> job_;
  ncclComm_t comm_;
  int gpu_;
  int rank_ = 0, size_ = 1;
  void* scratch_ = nullptr;
  void* desync_buffer_ = nullptr;
  void *rows_device_ = nullptr, *rows_host_ = nullptr;  // all_to_allv's count exchange, device and pinned host
  size_t rows_capacity_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::string nccl_version() {
  int version = 0;
  const ncclResult_t rc = ncclGetVersion(&version);
  if (rc != ncclSuccess) return fmt::format("unavailable: ncclGetVersion failed: {}", ncclGetErrorString(rc));
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousInfo& info, int gpu, CommOptions options) {
  const int gpus = cuda_device_count();
  if (gpu < 0 || gpu >= gpus) {
    ZEROTH_THROW(CommError, "nccl backend: rank {} wants GPU {} but {} usable GPU(s) are present ({})", info.rank, gpu, gpus,
                 gpus == 0 ? cuda_info().problem : "use LOCAL_RANK < GPUs per node");
  }
  auto job = std::make_shared<JobStore>(connect_job_store(info, options.timeout));
  ncclUniqueId id{};
  if (info.rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) ZEROTH_THROW(CommError, "ncclGetUniqueId failed: {}", ncclGetErrorString(rc));
    job->client->set("nccl/unique_id", std::vector<char>(id.internal, id.internal + sizeof id.internal));
  } else {
    const auto bytes = job->client->get("nccl/unique_id");
    ZEROTH_CHECK(bytes.size() == sizeof id.internal, "nccl unique id from the store has {} bytes, expected {}", bytes.size(),
                 sizeof id.internal);
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  CudaDeviceGuard guard(gpu);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, info.world_size, id, info.rank, &config);
  settle(comm, rc, fmt::format("ncclCommInitRankConfig(rank {} of {}, GPU {})", info.rank, info.world_size, gpu), options.timeout);
  return std::make_unique<NcclCommunicator>(std::move(job), comm, gpu, std::move(options));
}

}  // namespace zeroth

#else  // no CUDA backend

namespace zeroth {

std::string nccl_version() { return "not built (zeroth was built without the CUDA backend)"; }

std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousInfo& info, int, CommOptions) {
  ZEROTH_THROW(CommError,
               "rank {}: the nccl backend needs zeroth built with the CUDA backend (-DZEROTH_CUDA=ON on a machine with "
               "the CUDA toolkit); use the gloo backend on CPUs",
               info.rank);
}

}  // namespace zeroth

#endif
