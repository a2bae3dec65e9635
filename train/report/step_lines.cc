#include "train/report/step_lines.h"

#include <algorithm>  // std::max
#include <cstdint>    // uint64_t

#include <fmt/format.h>  // fmt::format

#include "core/memory.h"  // format_bytes

namespace zeroth::tools {

std::string wall_clock_line(const StepMetrics& s) {
  std::string swaps;
  if (s.swap_read_bytes + s.swap_write_bytes > 0) {
    const uint64_t in_step = s.optimizer_swap_read_bytes + s.optimizer_swap_write_bytes;
    // A rate only where the optimizer moved its bytes inside its own time.
    const std::string rate = s.speculation == Speculation::none && !s.update_delayed && s.optimizer_seconds > 0
                                 ? fmt::format(", at {:.2f} GB/s", static_cast<double>(in_step) / s.optimizer_seconds * 1e-9)
                                 : std::string();
    swaps =
        fmt::format(" | swap files: read {}, written {}, streams busy {:.2f} ms; of them the optimizer step: read {}, written {}{}",
                    format_bytes(s.swap_read_bytes), format_bytes(s.swap_write_bytes), s.swap_busy_seconds * 1e3,
                    format_bytes(s.optimizer_swap_read_bytes), format_bytes(s.optimizer_swap_write_bytes), rate);
  }
  const std::string in_backward = s.update_delayed
                                      ? " (update delayed: it runs under the next step; this is the wait for the one before)"
                                  : s.speculation == Speculation::none
                                      ? ""
                                      : fmt::format(" (sub-groups updated in backward: {})", speculation_name(s.speculation));
  const std::string ulysses = s.sequence_exchange_seconds >= 0
                                  ? fmt::format(" ({} {:.2f} of them, {:.1f}%)",
                                                s.sequence_ring ? "waits for the ring's sends" : "Ulysses all-to-alls",
                                                s.sequence_exchange_seconds * 1e3,
                                                100 * s.sequence_exchange_seconds /
                                                    std::max(1e-12, s.forward_seconds + s.backward_seconds))
                                  : std::string();
  return fmt::format("  time (ms) | forward: {:.2f} | backward: {:.2f}{} | reduce wait: {:.2f} | optimizer: {:.2f}{}{}\n",
                     s.forward_seconds * 1e3, s.backward_seconds * 1e3, ulysses, s.reduce_wait_seconds * 1e3,
                     s.optimizer_seconds * 1e3, in_backward, swaps);
}

}  // namespace zeroth::tools
