#include "train/report/console.h"

#include <unistd.h>  // isatty

#include <cmath>  // std::llround

#include <cerrno>      // errno
#include <cstdio>      // std::printf
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"         // cpu::num_threads
#include "core/error.h"               // ZEROTH_THROW
#include "core/memory.h"              // process_rss
#include "engine/pipeline/runner.h"   // pipe_kind_name
#include "train/report/box.h"         // box_rows, si
#include "train/report/mfu_peak.h"    // measure_peak, Peak
#include "train/report/step_lines.h"  // wall_clock_line
#include "train/report/monitors.h"    // Monitors
#include "train/report/run_report.h"  // write_run_report

namespace zeroth::tools {

namespace {

// "42s", "3m05s", "2h07m".
std::string duration(double seconds) {
  const auto t = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
}

class Console final : public RunConsole {
 public:
  // The output folder must be writable before the ranks start; what an earlier run left there is
  // replaced only once this run has passed its checks (on_start), so a refused run loses nothing.
  // The resident set before the run's data and engine, which the peak is measured above.
  explicit Console(const TrainConfig& c) : c_(c), rss_baseline_(process_rss()), peak_(measure_peak(c)) {
    bar_ = c.run.progress == "bar" || (c.run.progress == "auto" && isatty(STDOUT_FILENO) == 1);
    std::filesystem::create_directories(c.run.output_dir);
    metrics_.open(c.run.output_dir + "/metrics.jsonl", std::ios::app);
    if (!metrics_) ZEROTH_THROW(IoError, "cannot write {}/metrics.jsonl; check run.output_dir", c.run.output_dir);
  }

  void on_start(const TrainConfig& c, const Plan& plan, const RunFacts& f) override {
    // A resumed run continues the metrics of the run it resumes.
    if (c.run.resume.empty()) {
      metrics_.close();
      metrics_.open(c.run.output_dir + "/metrics.jsonl", std::ios::trunc);
    }
    monitors_ = std::make_unique<Monitors>(c.monitors, !c.run.resume.empty());
    std::ofstream config(c.run.output_dir + "/config.json");
    config << c.resolved.dump(2) << "\n";
    config.flush();
    if (!config)
      ZEROTH_THROW(IoError, "writing {}/config.json failed: {}; the disk may be full or the folder read-only", c.run.output_dir,
                   std::strerror(errno));
    check_written();
    const auto rows = box_rows(c, plan, f, peak_.how);
    std::printf("zeroth train: %s\n", c.run.name.c_str());
    for (const auto& [k, v] : rows) std::printf("  %-10s %s\n", k.c_str(), v.c_str());
    std::fflush(stdout);
    // What the report shows of the start: the box, the plan's bytes by tier and tag, the program.
    nlohmann::json planned;
    for (size_t t = 0; t < kTierCount; ++t) {
      for (MemTag tag : {MemTag::params, MemTag::grads, MemTag::optimizer, MemTag::buffers, MemTag::activations, MemTag::other})
        planned[std::string(tier_name(static_cast<Tier>(t)))][std::string(mem_tag_name(tag))] = at(f.need.bytes, static_cast<Tier>(t),
                                                                                                   tag);
    }
    metrics_ << nlohmann::json{{"start",
                                {{"rows", rows},
                                 {"planned_bytes", planned},
                                 {"device_allowance_bytes", f.need.allowance},
                                 {"program", plan.program_summary()},
                                 {"tokens_per_step", c.tokens_per_step()},
                                 {"train_batch_size", c.train_batch_size},
                                 {"steps", c.run.steps}}}}
                    .dump()
             << "\n";
    check_written();
    started_ = true;
  }

  void on_failure(const std::string& what) override {
    if (!started_) return;  // the folder still holds the last run's files
    metrics_ << nlohmann::json{{"error", what}}.dump() << "\n";
    check_written();
    write_report(true);
  }

  void on_step(const StepMetrics& s) override {
    const double model_flops = s.tokens_per_second *
                               c_.model.flops_per_token(s.attention_context > 0 ? s.attention_context : s.row_width);
    const double mfu = peak_.flops > 0 ? model_flops / peak_.flops : 0;
    nlohmann::json record{{"step", s.step},
                          {"loss", s.loss},
                          {"lr", s.lr},
                          {"grad_norm", s.grad_norm},
                          {"loss_scale", s.loss_scale},
                          {"skipped", s.skipped},
                          {"step_ms", s.step_seconds * 1e3},
                          {"tokens_per_s", s.tokens_per_second},
                          {"model_flops_per_s", model_flops},
                          {"mfu", mfu},
                          {"peak_bytes", s.peak_bytes}};
    if (s.moe) {
      record.update({{"moe_aux_loss", s.moe_aux_loss},
                     {"moe_z_loss", s.moe_z_loss},
                     {"moe_dropped", s.moe_dropped},
                     {"moe_max_load", s.moe_max_load}});
    }
    if (c_.engine.time_breakdown) {
      record.update({{"forward_ms", s.forward_seconds * 1e3},
                     {"backward_ms", s.backward_seconds * 1e3},
                     {"reduce_wait_ms", s.reduce_wait_seconds * 1e3},
                     {"optimizer_ms", s.optimizer_seconds * 1e3}});
      if (s.sequence_exchange_seconds >= 0)
        record[s.sequence_ring ? "ring_wait_ms" : "ulysses_exchange_ms"] = s.sequence_exchange_seconds * 1e3;
      if (s.swap_read_bytes + s.swap_write_bytes > 0) {
        record.update({{"swap_read_bytes", s.swap_read_bytes},
                       {"swap_write_bytes", s.swap_write_bytes},
                       {"swap_busy_ms", s.swap_busy_seconds * 1e3},
                       {"optimizer_swap_read_bytes", s.optimizer_swap_read_bytes},
                       {"optimizer_swap_write_bytes", s.optimizer_swap_write_bytes}});
      }
    }
    if (s.speculation != Speculation::none) record["optimizer_in_backward"] = speculation_name(s.speculation);
    if (s.update_delayed) record["update_delayed"] = true;
    metrics_ << record.dump() << "\n";
    check_written();
    const bool print = s.step == 1 || s.step % c_.steps_per_print == 0 || s.step == c_.run.steps;
    monitor_step(s, print);
    const std::string moe = s.moe ? fmt::format(" | aux {:.3f} drop {:.1f}% load {:.2f}", s.moe_aux_loss, 100 * s.moe_dropped,
                                                s.moe_max_load)
                                  : std::string();
    // The time left at the recent pace: an average of the step times that forgets the first.
    step_average_ = s.step == 1 || step_average_ == 0 ? s.step_seconds : 0.9 * step_average_ + 0.1 * s.step_seconds;
    const double eta = step_average_ * static_cast<double>(c_.run.steps - s.step);
    const std::string line =
        fmt::format("step {:>{}}/{} | loss {:.4f}{} | lr {:.2e} | grad norm {:.3f}{} | {} tok/s | {:.0f} ms{} | peak {} | eta {}",
                    s.step, std::to_string(c_.run.steps).size(), c_.run.steps, s.loss, moe, s.lr, s.grad_norm,
                    c_.engine.compute_dtype == DType::f16 ? fmt::format(" | scale {:g}", s.loss_scale) : "", si(s.tokens_per_second),
                    s.step_seconds * 1e3, peak_.flops > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", format_bytes(s.peak_bytes),
                    duration(eta));
    if (bar_) {
      clear_bar();
      if (print) std::printf("%s%s\n%s", line.c_str(), s.skipped ? " (overflow: skipped)" : "", breakdown_line(s).c_str());
      const int width = 30;
      const int done = static_cast<int>(width * s.step / c_.run.steps);
      std::printf("[%s%s] %lld/%lld  loss %.4f  %s tok/s%s  eta %s", std::string(done, '#').c_str(),
                  std::string(width - done, '.').c_str(), static_cast<long long>(s.step), static_cast<long long>(c_.run.steps), s.loss,
                  si(s.tokens_per_second).c_str(), peak_.flops > 0 ? fmt::format("  MFU {:.1f}%", 100 * mfu).c_str() : "",
                  duration(eta).c_str());
      bar_shown_ = true;
    } else if (print) {
      std::printf("%s%s\n%s", line.c_str(), s.skipped ? " (overflow: skipped)" : "", breakdown_line(s).c_str());
    }
    std::fflush(stdout);
  }

  // DeepSpeed's wall_clock_breakdown line, printed with the step line.
  std::string breakdown_line(const StepMetrics& s) const { return c_.engine.time_breakdown ? wall_clock_line(s) : ""; }

  void on_eval(int64_t step, const EvalResult& r) override {
    const double val = r.loss;
    metrics_ << nlohmann::json{{"step", step}, {"val_loss", val}, {"val_windows", r.windows}, {"val_windows_of", r.of}}.dump() << "\n";
    check_written();
    if (monitors_ && monitors_->enabled()) {
      monitors_->write(step * c_.train_batch_size, {{"Eval/Samples/val_loss", val}});
      monitors_->flush();
    }
    clear_bar();
    std::printf("validation at step %lld: loss %.4f (%s)\n", static_cast<long long>(step), val,
                r.windows == r.of ? fmt::format("all {} {}", r.of, r.rows).c_str()
                                  : fmt::format("the first {} of {} {}", r.windows, r.of, r.rows).c_str());
    std::fflush(stdout);
    write_report();
  }

  void on_resume(const ckpt::IoStats& io, int64_t step) override {
    std::printf("resumed from %s at step %lld (%s read and verified in %.2f s, %.2f GB/s; %s)\n", io.path.c_str(),
                static_cast<long long>(step), format_bytes(io.bytes).c_str(), io.seconds, gbps(io.bytes, io.seconds), io.way.c_str());
    std::fflush(stdout);
  }

  void on_checkpoint(const ckpt::IoStats& io, int64_t step) override {
    metrics_ << nlohmann::json{{"step", step},
                               {"checkpoint", io.path},
                               {"checkpoint_bytes", io.all_bytes},
                               {"checkpoint_seconds", io.seconds},
                               {"checkpoint_blocked_seconds", io.blocked_seconds}}
                    .dump()
             << "\n";
    check_written();
    const bool print = step % c_.steps_per_print == 0 || step == c_.run.steps || c_.run.checkpoint_interval >= c_.steps_per_print;
    if (!print) return;
    clear_bar();
    if (io.blocked_seconds < io.seconds) {
      std::printf("checkpoint %s: %s, written during the next step; training waited %.2f s for it\n", io.path.c_str(),
                  format_bytes(io.all_bytes).c_str(), io.blocked_seconds);
    } else {
      std::printf("checkpoint %s: %s in %.2f s (%.2f GB/s)\n", io.path.c_str(), format_bytes(io.all_bytes).c_str(), io.seconds,
                  gbps(io.all_bytes, io.seconds));
    }
    std::fflush(stdout);
  }

  static double gbps(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds * 1e-9 : 0.0; }

  void on_end(const TrainSummary& s) override {
    clear_bar();
    std::printf("%s after %lld steps%s in %.1f s: %s tok/s (median), loss %.4f -> %.4f",
                s.interrupted ? "stopped (interrupted)" : "done", static_cast<long long>(s.steps),
                s.start_step > 0
                    ? fmt::format(" ({} in this run, from the checkpoint at step {})", s.steps - s.start_step, s.start_step).c_str()
                    : "",
                s.seconds, si(s.tokens_per_second).c_str(), s.first_loss, s.last_loss);
    if (s.first_val_loss >= 0 && s.first_val_step == s.last_val_step) {
      std::printf(", validation %.4f (at step %lld only)", s.last_val_loss, static_cast<long long>(s.last_val_step));
    } else if (s.first_val_loss >= 0) {
      std::printf(", validation %.4f (step %lld) -> %.4f (step %lld)", s.first_val_loss, static_cast<long long>(s.first_val_step),
                  s.last_val_loss, static_cast<long long>(s.last_val_step));
    }
    std::printf("\n  peak memory on rank 0: %s (params %s, grads %s, optimizer %s, buffers %s, activations %s%s)\n  metrics: "
                "%s/metrics.jsonl\n",
                format_bytes(s.peak_total).c_str(), format_bytes(s.peak[0]).c_str(), format_bytes(s.peak[1]).c_str(),
                format_bytes(s.peak[2]).c_str(), format_bytes(s.peak[3]).c_str(), format_bytes(s.peak[4]).c_str(),
                s.peak[5] > 0 ? (", other " + format_bytes(s.peak[5]) + ": gathering the weights to save them").c_str() : "",
                c_.run.output_dir.c_str());
    if (s.checkpoints_saved > 0) {
      // Said whether or not its step was printed: after Ctrl-C it is what the run goes on from.
      std::printf("  checkpoint: %s (zeroth train ... --resume %s goes on from it)\n", s.last_save.path.c_str(),
                  c_.run.output_dir.c_str());
    }
    const std::string arch = c_.model.hf_architecture();
    const std::string names = arch.empty() ? std::string("zeroth's names (no Hugging Face class has this model)")
                                           : "Hugging Face " + arch + " names";
    std::printf("  weights: %s (%s, %s, %s; gathered and written in %.2f s, %.2f GB/s)\n", s.weights_path.c_str(),
                format_bytes(s.weights_bytes).c_str(), dtype_name(s.weights_dtype).data(), names.c_str(), s.weights_seconds,
                s.weights_seconds > 0 ? static_cast<double>(s.weights_bytes) / s.weights_seconds * 1e-9 : 0.0);
    if (s.host_peak > 0 || s.swap_bytes > 0) {
      std::printf("  offload on rank 0: host memory peak %s%s, swap files %s; process peak RSS %s\n",
                  format_bytes(s.host_peak).c_str(),
                  c_.run.host_memory > 0 ? (" of " + format_bytes(c_.run.host_memory) + " (run.host_memory)").c_str() : "",
                  format_bytes(s.swap_bytes).c_str(), format_bytes(s.peak_rss).c_str());
    }
    nlohmann::json pipeline;
    if (c_.parallel.pipeline > 1) {
      std::string peaks;
      for (size_t k = 0; k < s.stage_activation_peak.size(); ++k)
        peaks += fmt::format("{}{}", k == 0 ? "" : ", ", format_bytes(s.stage_activation_peak[k]));
      std::printf("  pipeline: %d stages, %s, %lld micro-batches: bubble %.3f measured (median over the steps after the first), "
                  "%.3f by the formula; activations at peak per stage: %s\n",
                  c_.parallel.pipeline, pipe_kind_name(c_.parallel.schedule).data(),
                  static_cast<long long>(c_.engine.gradient_accumulation_steps), s.pipeline_bubble, s.bubble_formula, peaks.c_str());
      pipeline = {{"bubble", s.pipeline_bubble},
                  {"bubble_formula", s.bubble_formula},
                  {"stage_activation_peak_bytes", s.stage_activation_peak}};
      if (!s.trace.is_null()) {
        const std::string path = c_.run.output_dir + "/trace.json";
        std::ofstream trace(path);
        trace << s.trace.dump() << "\n";
        trace.flush();
        if (!trace)
          ZEROTH_THROW(IoError, "writing {} failed: {}; the disk may be full or the folder read-only", path, std::strerror(errno));
        std::printf("  trace: %s (Chrome trace format: chrome://tracing or ui.perfetto.dev)\n", path.c_str());
        pipeline["trace"] = path;
      }
    }
    nlohmann::json tensor;
    if (c_.parallel.tensor > 1) {
      const auto& t = s.tensor_traffic;
      const auto bytes = [&](CollectiveOp op) { return t.bytes[static_cast<size_t>(op)]; };
      std::printf("  tensor parallel: rank 0's model collectives in its group of %d: all-reduce %s, reduce-scatter %s, all-gather %s "
                  "in %lld steps and their validations (logical bytes, as the ZeRO paper counts volume: an all-reduce twice its "
                  "buffer)\n",
                  c_.parallel.tensor, format_bytes(bytes(CollectiveOp::all_reduce)).c_str(),
                  format_bytes(bytes(CollectiveOp::reduce_scatter)).c_str(), format_bytes(bytes(CollectiveOp::all_gather)).c_str(),
                  static_cast<long long>(s.steps - s.start_step));
      tensor = {{"ranks", c_.parallel.tensor},
                {"sequence_parallel", c_.parallel.sequence_parallel},
                {"all_reduce_bytes", bytes(CollectiveOp::all_reduce)},
                {"reduce_scatter_bytes", bytes(CollectiveOp::reduce_scatter)},
                {"all_gather_bytes", bytes(CollectiveOp::all_gather)}};
    }
    nlohmann::json device_peak;
    for (size_t t = 0; t < kMemTagCount; ++t) device_peak[std::string(mem_tag_name(static_cast<MemTag>(t)))] = s.peak[t];
    metrics_ << nlohmann::json{{"summary",
                                {{"steps", s.steps},
                                 {"pipeline", pipeline},
                                 {"tensor", tensor},
                                 {"interrupted", s.interrupted},
                                 {"seconds", s.seconds},
                                 {"tokens_per_s", s.tokens_per_second},
                                 {"loss", s.last_loss},
                                 {"val_loss", s.last_val_loss},
                                 {"peak_bytes", s.peak_total},
                                 {"host_peak_bytes", s.host_peak},
                                 {"swap_bytes", s.swap_bytes},
                                 {"weights", s.weights_path},
                                 {"weights_bytes", s.weights_bytes},
                                 {"weights_seconds", s.weights_seconds},
                                 {"swap_disk_bytes", s.swap_disk_bytes},
                                 {"peak_rss_bytes", s.peak_rss},
                                 {"peak_rss_before_weights_bytes", s.peak_rss_before_save},
                                 {"rss_baseline_bytes", rss_baseline_},
                                 {"device_peak_bytes", device_peak},
                                 {"monitor_seconds", monitor_seconds_},
                                 {"report_seconds", report_seconds_}}}}
                    .dump()
             << "\n";
    check_written();
    if (monitors_) monitors_->flush();
    write_report(true);
    std::printf("  report: %s/report.html (its writes took %.2f s in all)\n", c_.run.output_dir.c_str(), report_seconds_);
    std::fflush(stdout);
  }

 private:
  // report.html from what the folder holds now. At a validation only while the reports so far took
  // under 1% of the run (a long run's report takes seconds); always at the end.
  // A report that cannot be written is a warning: the run and its records go on.
  void write_report(bool at_end = false) {
    const double run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
    if (!at_end && report_seconds_ > 0.01 * run_seconds) return;
    const auto begin = std::chrono::steady_clock::now();
    try {
      report::write_run_report(c_.run.output_dir, c_.run.output_dir + "/report.html");
    } catch (const Error& e) {
      std::fprintf(stderr, "zeroth: warning: %s/report.html was not written: %s\n", c_.run.output_dir.c_str(), e.what());
    }
    report_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }

  // DeepSpeed's tags at DeepSpeed's x (the samples trained), with zeroth's grad_norm and tokens/s;
  // wall_clock_breakdown's times as DeepSpeed splits them (backward_inner: without the reduction).
  void monitor_step(const StepMetrics& s, bool flush) {
    if (!monitors_ || !monitors_->enabled()) return;
    Scalars scalars = {{"Train/Samples/train_loss", s.loss},
                       {"Train/Samples/lr", s.lr},
                       {"Train/Samples/grad_norm", s.grad_norm},
                       {"Train/Samples/tokens_per_s", s.tokens_per_second}};
    if (c_.engine.compute_dtype == DType::f16) scalars.emplace_back("Train/Samples/loss_scale", s.loss_scale);
    if (c_.engine.time_breakdown) {
      scalars.insert(scalars.end(), {{"Train/Samples/elapsed_time_ms_forward", s.forward_seconds * 1e3},
                                     {"Train/Samples/elapsed_time_ms_backward", (s.backward_seconds + s.reduce_wait_seconds) * 1e3},
                                     {"Train/Samples/elapsed_time_ms_backward_inner", s.backward_seconds * 1e3},
                                     {"Train/Samples/elapsed_time_ms_backward_allreduce", s.reduce_wait_seconds * 1e3},
                                     {"Train/Samples/elapsed_time_ms_step", s.optimizer_seconds * 1e3}});
    }
    const auto begin = std::chrono::steady_clock::now();
    monitors_->write(s.step * c_.train_batch_size, scalars);
    if (flush) monitors_->flush();
    monitor_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }

  // Every record reaches the file or the run ends with an error naming it.
  void check_written() {
    metrics_.flush();
    if (!metrics_) {
      ZEROTH_THROW(IoError, "writing {}/metrics.jsonl failed: {}; the disk may be full or the folder read-only", c_.run.output_dir,
                   std::strerror(errno));
    }
  }
  void clear_bar() {
    if (bar_shown_) std::printf("\r\033[K");
    bar_shown_ = false;
  }
  const TrainConfig& c_;
  size_t rss_baseline_ = 0;
  bool bar_ = false, bar_shown_ = false;
  std::ofstream metrics_;
  std::unique_ptr<Monitors> monitors_;
  bool started_ = false;  // on_start has replaced the last run's metrics
  Peak peak_;
  double step_average_ = 0;  // seconds
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  double report_seconds_ = 0, monitor_seconds_ = 0;  // spent writing them
};


}  // namespace

std::unique_ptr<RunConsole> make_console(const TrainConfig& c) { return std::make_unique<Console>(c); }

}  // namespace zeroth::tools
