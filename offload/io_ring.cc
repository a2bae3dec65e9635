#include "offload/io_ring.h"

#include <sys/uio.h>  // iovec

#include <cerrno>  // ENOSYS, EPERM
#include <mutex>   // std::once_flag

#include "core/error.h"  // ZEROTH_CHECK, ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN

namespace zeroth::offload {

namespace {

std::once_flag sqpoll_warning;

// A polling thread spins on a core for this long after the last submission before it sleeps;
// the offload tier shares the cores with the CPU optimizer, so it sleeps early.
constexpr unsigned kSqThreadIdleMs = 20;

bool refused(int rc) { return rc == -ENOSYS || rc == -EPERM; }

}  // namespace

std::unique_ptr<IoRing> IoRing::open(int fd, const std::string& path, unsigned entries, bool sqpoll, const IoRing* share) {
  std::unique_ptr<IoRing> ring(new IoRing);
  ring->fd_ = fd;
  ring->path_ = path;
  int rc = -EINVAL;
  if (sqpoll) {
    auto init = [&](bool attach) {
      io_uring_params params{};
      params.flags = IORING_SETUP_SQPOLL;
      params.sq_thread_idle = kSqThreadIdleMs;
      if (attach) {
        // One polling thread for all rings of a file: a thread per ring would take a core each.
        params.flags |= IORING_SETUP_ATTACH_WQ;
        params.wq_fd = static_cast<unsigned>(share->ring_.ring_fd);
      }
      return io_uring_queue_init_params(entries, &ring->ring_, &params);
    };
    if (share != nullptr && share->sqpoll()) rc = init(true);
    if (rc < 0) rc = init(false);
    if (rc < 0 && rc != -ENOSYS) {
      if (rc != -EPERM && rc != -EINVAL) {
        ZEROTH_THROW(IoError, "io_uring_queue_init_params({}, ring, IORING_SETUP_SQPOLL) for {} failed: {}", entries, path,
                     zeroth::detail::errno_text(-rc));
      }
      // EPERM before Linux 5.11 without CAP_SYS_NICE (or io_uring refused: the plain ring
      // below says so), EINVAL where SQPOLL is unknown.
      std::call_once(sqpoll_warning, [&] {
        ZLOG_WARN("IORING_SETUP_SQPOLL refused: {}; {} and later files use rings without a polling thread",
                  zeroth::detail::errno_text(-rc), path);
      });
    }
  }
  if (rc < 0) rc = io_uring_queue_init(entries, &ring->ring_, 0);
  if (refused(rc)) return nullptr;
  if (rc < 0)
    ZEROTH_THROW(IoError, "io_uring_queue_init({}, ring, 0) for {} failed: {}", entries, path, zeroth::detail::errno_text(-rc));
  ring->initialised_ = true;

  // A fixed file spares the kernel a file-table lookup and reference count per transfer; a
  // kernel without it takes the plain descriptor.
  ring->fixed_file_ = io_uring_register_files(&ring->ring_, &fd, 1) == 0;
  ring->buffer_table_ = io_uring_register_buffers_sparse(&ring->ring_, kBufferSlots) == 0;
  return ring;
}

IoRing::~IoRing() {
  if (initialised_) io_uring_queue_exit(&ring_);
}

void IoRing::register_buffer(unsigned slot, void* data, std::size_t bytes) {
  ZEROTH_CHECK(buffer_table_ && slot < kBufferSlots && bytes <= kMaxBufferBytes,
               "IoRing::register_buffer({}, {}, {}) for {}: needs the buffer table, a slot below {} and at most {} bytes", slot, data,
               bytes, path_, kBufferSlots, kMaxBufferBytes);
  iovec region{data, bytes};
  const int rc = io_uring_register_buffers_update_tag(&ring_, slot, &region, nullptr, 1);
  if (rc < 0) {
    ZEROTH_THROW(IoError,
                 "io_uring_register_buffers_update_tag(slot {}, {} bytes at {}) for {} failed: {} (registered buffers are "
                 "pinned: raise the locked-memory limit, ulimit -l, or register less)",
                 slot, bytes, data, path_, zeroth::detail::errno_text(-rc));
  }
}

void IoRing::prepare(io_uring_sqe* sqe, bool is_write, void* buffer, unsigned length, std::uint64_t offset, int buffer_slot) const {
  const int file = fixed_file_ ? 0 : fd_;
  if (buffer_slot >= 0) {
    if (is_write) io_uring_prep_write_fixed(sqe, file, buffer, length, offset, buffer_slot);
    else io_uring_prep_read_fixed(sqe, file, buffer, length, offset, buffer_slot);
  } else {
    if (is_write) io_uring_prep_write(sqe, file, buffer, length, offset);
    else io_uring_prep_read(sqe, file, buffer, length, offset);
  }
  if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
}

}  // namespace zeroth::offload
