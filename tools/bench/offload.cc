// `zeroth bench offload`: sequential O_DIRECT write and read GB/s of one file through AsyncFile
// over a sweep of block size, queue depth, threads and SQPOLL, with fio (io_uring, direct) on
// the same file and settings in the same run as the reference; prints the best setting as
// DeepSpeed's `aio` section. With --device cuda, the host<->device copy rates as well.
#include <fcntl.h>        // open, posix_fallocate
#include <pthread.h>      // pthread_kill, pthread_self
#include <signal.h>       // sigaction, raise
#include <sys/mman.h>     // madvise
#include <sys/statvfs.h>  // statvfs
#include <unistd.h>       // fork, execv, unlink, access, close

#include <algorithm>   // std::max, std::min
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::printf
#include <cctype>      // std::isspace
#include <cstring>     // std::memset, std::strncpy
#include <deque>       // std::deque
#include <filesystem>  // std::filesystem::is_directory
#include <optional>    // std::optional
#include <sstream>     // std::stringstream
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"              // ZEROTH_CHECK, ZEROTH_THROW, SYSCALL_CHECK
#include "core/log.h"                // ZLOG_WARN, log::set_level
#include "core/memory.h"             // parse_bytes, format_bytes
#include "core/stats.h"              // median
#include "offload/aio.h"             // AsyncFile, IoOptions
#include "offload/aligned_buffer.h"  // AlignedBuffer
#include "tools/bench/offload.h"     // CopyRates, check_cuda_device, measure_cuda_copies
#include "tools/bench/offload_report.h"
#include "tools/bench/bench.h"
#include "tools/launch/process.h"  // run_process

namespace zeroth::tools {
namespace bench_offload {

using clock = std::chrono::steady_clock;
using offload::AlignedBuffer;
using offload::AsyncFile;
using offload::IoOptions;

constexpr std::size_t kKiB = 1024, kMiB = 1024 * kKiB;
// The default sweep: queue depths at 1 MiB blocks (DeepSpeed's default block), then block sizes
// at the best depth, then threads and SQPOLL at the best of those.
const std::vector<std::size_t> kBlockSizes = {128 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB, 16 * kMiB};
const std::vector<unsigned> kQueueDepths = {1, 4, 8, 16, 32, 64};
const std::vector<unsigned> kThreads = {2, 4};
// Points with more bytes in flight than this are skipped: they only hold memory.
constexpr std::size_t kMaxInFlight = 256 * kMiB;
// A pass keeps one block in flight per ring slot, each a request of its own with a buffer of its
// own, as fio keeps one buffer per I/O unit: the same bytes of host memory in flight as fio's at
// the same point. (Where the disk is a virtual machine's, the host copies every transfer, and it
// copies faster into buffers that stay in its caches: at depth 8, 12 MiB of buffers read 5-10%
// slower than 8 MiB, so a larger footprint than fio's measures the host's caches.)

struct Options {
  std::string path;
  std::string size = "2GiB";
  std::string device = "cpu";
  int reps = 3;
  bool full_sweep = false;
  bool small_pages = false;
  bool json = false;
  uint64_t sub_group_size = SwapperSetting{}.sub_group_size;
};

// The file this run creates, removed on every way out: scope exit and the usual signals.
char g_data_path[4096];
pthread_t g_main_thread;

// A signal can land on any thread, and the main thread reopens the file (O_CREAT) between sweep
// points: unlinked from an I/O worker, the file could be made again before the process dies. So
// the main thread, the only one that opens it, does the unlinking: a signal elsewhere is passed on.
extern "C" void remove_file_and_reraise(int signal) {
  if (!::pthread_equal(::pthread_self(), g_main_thread)) {
    ::pthread_kill(g_main_thread, signal);
    return;
  }
  kill_running_child();  // fio, which would lay the file out again
  ::unlink(g_data_path);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

struct FileGuard {
  explicit FileGuard(const std::string& path) {
    std::strncpy(g_data_path, path.c_str(), sizeof g_data_path - 1);
    g_main_thread = ::pthread_self();
    struct sigaction action {};
    action.sa_handler = remove_file_and_reraise;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &action, nullptr);
  }
  ~FileGuard() {
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
    ::unlink(g_data_path);
    g_data_path[0] = '\0';
  }
};

std::optional<std::string> find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  return std::nullopt;
}

class OffloadBench {
 public:
  OffloadBench(const Options& o, std::string data_path, std::size_t size, std::optional<std::string> fio)
      : o_(o), data_path_(std::move(data_path)), size_(size), fio_(std::move(fio)) {
    // The largest point's blocks in flight, allocated and touched once for the whole sweep.
    pool_ = AlignedBuffer(std::min(size_, kMaxInFlight));
    // fio's buffers are plain 4 KiB pages; this makes ours the same, to compare the engines alone.
    if (o.small_pages) ::madvise(pool_.data(), pool_.size(), MADV_NOHUGEPAGE);
    std::memset(pool_.data(), 0x5A, pool_.size());
    // Every pass then overwrites allocated blocks, as fio does after its own first pass.
    AsyncFile file(data_path_, AsyncFile::Mode::read_write);
    const int fd = SYSCALL_CHECK(::open(data_path_.c_str(), O_WRONLY | O_CLOEXEC));
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size_));
    ::close(fd);
    if (rc != 0 && rc != EOPNOTSUPP) ZEROTH_THROW(IoError, "posix_fallocate of {} bytes for {} failed", size_, data_path_);
    direct_ = file.direct();
    io_uring_ = file.io_uring();
    pass(file, true, 1 * kMiB, 32);  // the default AsyncFile: 1 MiB blocks, depth 32
  }

  bool direct() const { return direct_; }
  bool io_uring() const { return io_uring_; }

  // Measures one setting `reps` times (write, then read), with fio at the same block size and
  // depth between the repetitions when `with_fio`.
  Point measure(const Setting& s, bool with_fio, int reps) {
    Point point;
    point.setting = s;
    const std::size_t blocks = s.queue_depth * s.threads;
    AsyncFile file(data_path_, AsyncFile::Mode::read_write, IoOptions{s.block_size, s.queue_depth, true, s.threads, s.sqpoll});
    point.sqpoll_used = file.sqpoll();
    if (s.registered) {
      try {
        // Whole huge pages: the mark that keeps registered pages out of fio's process would split
        // a huge page it ended in.
        const std::size_t whole = (blocks * s.block_size + offload::kHugePageBytes - 1) / offload::kHugePageBytes *
                                  offload::kHugePageBytes;
        point.registered_used = file.register_buffer(pool_.data(), std::min(whole, pool_.size()));
      } catch (const IoError& e) {
        ZLOG_WARN("bench offload: running without registered buffers: {}", e.what());
      }
    }
    for (int rep = 0; rep < reps; ++rep) {
      point.write_gbps.push_back(size_ / pass(file, true, s.block_size, blocks) / 1e9);
      point.read_gbps.push_back(size_ / pass(file, false, s.block_size, blocks) / 1e9);
      if (with_fio) {
        const auto [write, read] = run_fio(s, point.registered_used, point.sqpoll_used);
        point.fio_write_gbps.push_back(write);
        point.fio_read_gbps.push_back(read);
      }
    }
    return point;
  }

  std::string fio_version() {
    std::string version = run_process({*fio_, "--version"}).out;
    while (!version.empty() && std::isspace(static_cast<unsigned char>(version.back()))) version.pop_back();
    return version;
  }

 private:
  // The whole file in order, one block per request, `blocks` requests at a time, each with its own
  // block of the pool. Seconds. The buffers are written and read as they are: the engine's tests
  // check the bytes.
  double pass(AsyncFile& file, bool write, std::size_t block, std::size_t blocks) {
    std::deque<offload::IoHandle> pending;
    const auto t0 = clock::now();
    std::size_t i = 0;
    for (std::size_t offset = 0; offset < size_; offset += block, ++i) {
      if (pending.size() == blocks) {
        pending.front().wait();
        pending.pop_front();
      }
      std::byte* buffer = pool_.data() + (i % blocks) * block;
      const std::size_t length = std::min(block, size_ - offset);
      pending.push_back(write ? file.write(buffer, length, offset) : file.read(buffer, length, offset));
    }
    for (auto& h : pending) h.wait();
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  // fio's sequential write then read of the same file (one job after the other), GB/s each, set up
  // as a user tuning fio would and as zeroth runs: buffers in 2 MiB huge pages (glibc's malloc
  // tunables, fio's iomem_align), registered with the ring (fixedbufs, where zeroth's are) and the
  // file registered too, a whole depth submitted at once and half reaped per wait; zeroth's
  // threads as jobs over equal slices of the file, its SQPOLL as fio's.
  std::pair<double, double> run_fio(const Setting& s, bool registered, bool sqpoll) {
    const unsigned jobs = s.threads;
    const std::size_t slice = size_ / jobs;
    std::vector<std::string> argv = {*fio_, "--output-format=json",
                                     // Jobs as threads of the one process the parent-death
                                     // signal kills; forked job processes outlived it.
                                     "--thread", "--filename=" + data_path_, fmt::format("--size={}", slice),
                                     fmt::format("--bs={}", s.block_size), fmt::format("--iodepth={}", s.queue_depth),
                                     fmt::format("--iodepth_batch_submit={}", s.queue_depth),
                                     fmt::format("--iodepth_batch_complete_min={}", std::max(1u, s.queue_depth / 2)),
                                     "--ioengine=io_uring", "--direct=1", "--registerfiles", "--iomem_align=2m",
                                     fmt::format("--numjobs={}", jobs), fmt::format("--offset_increment={}", slice),
                                     "--group_reporting"};
    // As zeroth got them: the kernel may refuse registration or a polling thread.
    if (registered) argv.push_back("--fixedbufs");
    if (sqpoll) argv.push_back("--sqthread_poll=1");
    for (const char* job : {"--name=write", "--rw=write", "--name=read", "--stonewall", "--rw=read"}) argv.push_back(job);
    const ProcessResult fio = run_process(argv, {{"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=131072"}});
    if (fio.status != 0) ZEROTH_THROW(IoError, "fio exited with status {}: {}", fio.status, fio.err);
    try {
      const auto report = nlohmann::json::parse(fio.out);
      const auto& jobs_report = report.at("jobs");
      return {jobs_report.at(0).at("write").at("bw_bytes").get<double>() / 1e9,
              jobs_report.at(1).at("read").at("bw_bytes").get<double>() / 1e9};
    } catch (const nlohmann::json::exception& e) {
      ZEROTH_THROW(IoError, "fio's report is not the JSON fio 3 writes ({}): {}{}", e.what(), fio.out, fio.err);
    }
  }

  const Options& o_;
  std::string data_path_;
  std::size_t size_;
  std::optional<std::string> fio_;
  AlignedBuffer pool_;
  bool direct_ = false, io_uring_ = false;
};

// Long: the benchmark's procedure (checks, the sweep of block size, depth and threads, the swapper's steps at the chosen
// setting, the report); each stage picks from the results of the one before.
void run(const Options& o) {
  ZEROTH_CHECK(!o.path.empty(), "--path: the directory to measure is required");
  ZEROTH_CHECK(std::filesystem::is_directory(o.path), "--path {}: not a directory", o.path);
  const std::size_t size = parse_bytes(o.size);
  ZEROTH_CHECK(size >= 4 * kMiB && size % kMiB == 0, "--size {}: must be a whole number of MiB, at least 4 MiB", o.size);
  ZEROTH_CHECK(o.reps >= 1, "--reps {}: must be at least 1", o.reps);
  ZEROTH_CHECK(o.device == "cpu" || o.device == "cuda" || o.device.rfind("cuda:", 0) == 0, "--device {}: use cpu, cuda or cuda:N",
               o.device);
  const bool cuda = o.device != "cpu";
  // Before the sweep, so a missing GPU is said at once, not after minutes of disk work.
  if (cuda) check_cuda_device(o.device);

  struct statvfs fs {};
  SYSCALL_CHECK(::statvfs(o.path.c_str(), &fs));
  const std::size_t free_bytes = static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
  if (size > free_bytes) {
    ZEROTH_THROW(IoError, "--size {} does not fit in {}: {} free; pass a smaller --size or another --path", format_bytes(size), o.path,
                 format_bytes(free_bytes));
  }

  const std::string dir = o.path.back() == '/' ? o.path : o.path + "/";
  const std::string data_path = fmt::format("{}zeroth-bench-offload-{}.data", dir, ::getpid());
  FileGuard guard(data_path);
  std::optional<std::string> fio = find_on_path("fio");
  OffloadBench bench(o, data_path, size, fio);
  if (fio && !bench.direct()) {
    ZLOG_WARN("bench offload: {} refuses O_DIRECT, so fio (direct=1) cannot run there; zeroth runs buffered", o.path);
    fio.reset();
  }
  OffloadResults results;
  results.path = o.path;
  results.size = size;
  results.reps = o.reps;
  results.direct = bench.direct();
  results.io_uring = bench.io_uring();
  if (fio) results.fio_version = bench.fio_version();
  if (!o.json) print_sweep_header(results);
  std::vector<Point> sweep;
  auto measure = [&](const Setting& s, bool with_fio) {
    // Each thread (and each of fio's jobs, over its slice of the file) gets two blocks or more.
    if (s.block_size * s.queue_depth * s.threads > kMaxInFlight || s.block_size * s.threads > size / 2) return;
    sweep.push_back(bench.measure(s, with_fio && fio.has_value(), o.reps));
    if (!o.json) print_row(sweep.back());
  };
  // The point of highest score among those `allowed`; nullptr when none is.
  auto best_where = [&](auto&& allowed) {
    const Point* top = nullptr;
    for (const auto& p : sweep)
      if (allowed(p.setting) && (top == nullptr || p.score() > top->score())) top = &p;
    return top;
  };
  auto best = [&] { return *best_where([](const Setting&) { return true; }); };

  if (o.full_sweep) {
    for (std::size_t bs : kBlockSizes)
      for (unsigned qd : kQueueDepths) measure({bs, qd}, true);
  } else {
    for (unsigned qd : kQueueDepths) measure({1 * kMiB, qd}, true);
    const unsigned qd = best().setting.queue_depth;
    for (std::size_t bs : kBlockSizes)
      if (bs != 1 * kMiB) measure({bs, qd}, true);
  }
  // More threads at the best block size and depth whose bytes in flight still fit.
  for (unsigned t : kThreads) {
    const Point* base = best_where(
        [&](const Setting& s) { return s.threads == 1 && s.block_size * s.queue_depth * t <= kMaxInFlight; });
    if (base != nullptr) measure({base->setting.block_size, base->setting.queue_depth, t}, true);
  }
  const Setting top = best().setting;
  if (bench.io_uring()) {
    measure({top.block_size, top.queue_depth, top.threads, true}, true);
    measure({top.block_size, top.queue_depth, top.threads, false, false}, true);
  }
  const Point chosen = best();

  // The swapper's steps alternate with raw passes at the chosen setting: where a disk's rate
  // wanders (a virtual disk's burst allowance running out), each step is held against the rate
  // the disk had just before it.
  const SwapperSetting swapper_setting{chosen.setting.block_size, chosen.setting.queue_depth, chosen.setting.threads,
                                       o.sub_group_size};
  const log::Level level = log::level();
  log::set_level(log::Level::warn);  // the engine's plan table
  SwapperBench swapper(o.path, size, swapper_setting);
  log::set_level(level);
  SwapperResult& result = results.swapper;
  result.beside.setting = chosen.setting;
  for (int rep = 0; rep < o.reps; ++rep) {
    const Point raw = bench.measure(chosen.setting, false, 1);
    result.beside.write_gbps.push_back(raw.write());
    result.beside.read_gbps.push_back(raw.read());
    const double seconds = swapper.step();
    const double gbps = static_cast<double>(swapper.read_bytes() + swapper.write_bytes()) / seconds * 1e-9;
    result.seconds.push_back(seconds);
    result.gbps.push_back(gbps);
    result.vs_raw.push_back(gbps / swapper.ceiling_gbps(raw.read(), raw.write()));
  }
  result.vs_best = median(result.gbps) / swapper.ceiling_gbps(best_rate(sweep, &Point::read), best_rate(sweep, &Point::write));
  result.params = swapper.params();
  result.padded_params = swapper.padded_params();
  result.sub_groups = swapper.sub_groups();
  result.sub_group_size = o.sub_group_size;
  result.read_bytes = swapper.read_bytes();
  result.write_bytes = swapper.write_bytes();
  results.sweep = std::move(sweep);
  results.chosen = chosen;
  if (cuda) results.copies = measure_cuda_copies(o.device, std::min<std::size_t>(size, std::size_t{1} << 30), o.reps);
  if (o.json) {
    print_offload_json(results);
  } else {
    print_offload_summary(results);
  }
}

}  // namespace bench_offload

void add_bench_offload_command(CLI::App& bench) {
  using namespace bench_offload;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("offload", "Sequential O_DIRECT write/read GB/s through io_uring (sweep), next to fio");
  cmd->add_option("--path", options->path,
                  "Directory on the disk to measure: a file of --size and, beside it, the swapper's files of about as much are "
                  "made there and removed at the end")
      ->required();
  cmd->add_option("--size", options->size, "File size (default 2GiB)");
  cmd->add_option("--reps", options->reps, "Repetitions per point; the median is reported (default 3)");
  cmd->add_flag("--full-sweep", options->full_sweep, "Every block size x queue depth (default: depths at 1 MiB, then block sizes)");
  cmd->add_flag("--small-pages", options->small_pages,
                "Host buffers in 4 KiB pages (default: 2 MiB pages where the kernel has transparent huge pages, as fio's are given "
                "here)");
  cmd->add_option("--sub-group-size", options->sub_group_size,
                  "The swapper's zero_optimization.sub_group_size, in elements (default 25000000)");
  cmd->add_option("--device", options->device, "cpu, or cuda[:N] to add host<->GPU copy rates (default cpu)");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
