// `zeroth train CONFIG [--set key.path=value]... [--dry-run] [--resume [DIR]]`: resolves the config, starts the
// ranks (threads on the local backend, or this process as one rank when a launcher started it)
// and shows the run: a config box, a progress bar on a terminal or plain lines when piped,
// validation losses, a summary; metrics also go to <output_dir>/metrics.jsonl.

#include <atomic>      // std::atomic
#include <csignal>     // std::signal
#include <cstdio>      // std::printf
#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem
#include <memory>      // std::make_shared
#include <mutex>       // std::mutex
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/gloo/gloo_comm.h"    // make_gloo_communicator
#include "comm/local/local_comm.h"  // run_local_ranks
#include "comm/rendezvous.h"        // rendezvous_from_env
#include "core/cpu/kernels.h"       // cpu::num_threads
#include "core/env.h"               // env::kLogLevel
#include "core/error.h"             // ZEROTH_THROW
#include "core/log.h"               // log::set_level
#include "offload/io_fault.h"       // IoFault
#include "engine/plan/plan.h"       // make_plan
#include "train/generate.h"         // generate
#include "train/run_folder.h"       // is_run_folder, resume_path
#include "train/trainer.h"          // train
#include "models/decoder/gpt.h"     // Gpt
#include "core/cpu/threads.h"       // share_cores
#include "tools/cli/commands.h"
#include "tools/cli/options.h"     // RunConfigArgs, on_every_rank
#include "train/report/console.h"  // make_console, tensor_line

namespace zeroth::tools {
namespace train_cmd {

std::atomic<bool> g_stop{false};

extern "C" void on_interrupt(int) {
  if (g_stop.exchange(true)) std::_Exit(130);  // a second Ctrl-C does not wait for the step
}

struct Options {
  RunConfigArgs run;
  bool dry_run = false;
};

void dry_run(const TrainConfig& c) {
  std::printf("%s\n", c.resolved.dump(2).c_str());
  check_data(c);
  // Planned first, so a config the planner refuses is refused before anything is printed for it.
  int widest = 0;
  const StagePlan largest = largest_stage(c, &widest);
  if (c.parallel.pipeline > 1 || c.parallel.tensor > 1) {
    std::printf("grid: dp %d x pp %d x tp %d = %d ranks, Megatron's order: rank = stage x %d + data-parallel rank x %d + "
                "tensor-parallel rank (a tensor-parallel group's ranks adjacent)\n",
                c.data_parallel(), c.parallel.pipeline, c.parallel.tensor, c.run.world_size, c.data_parallel() * c.parallel.tensor,
                c.parallel.tensor);
  }
  if (c.parallel.tensor > 1) std::printf("tensor parallel: %s\n", tensor_line(c).c_str());
  if (c.parallel.pipeline > 1) {
    // Every rank's program, proved sound before anything runs; then the stage that holds the most.
    const PipeSchedule schedule = make_pipe_schedule(c.parallel.schedule, c.parallel.pipeline,
                                                     static_cast<int>(c.engine.gradient_accumulation_steps),
                                                     c.parallel.virtual_stages);
    const std::string problem = check_schedule(schedule);
    if (!problem.empty()) ZEROTH_THROW(InvalidArgument, "the pipeline schedule is unsound: {}", problem);
    const PipeTimeline timeline = simulate_schedule(schedule);
    std::printf("pipeline: %d stages, %s, %d micro-batches%s: deadlock free; bubble %.3f by the formula, %.3f simulated "
                "(backward = 2 x forward); layers per %sstage: %s\n",
                schedule.stages, pipe_kind_name(schedule.kind).data(), schedule.micro_batches,
                schedule.chunks > 1 ? fmt::format(", {} chunks per stage", schedule.chunks).c_str() : "",
                pipe_bubble_formula(schedule.kind, schedule.stages, schedule.micro_batches, schedule.chunks), timeline.bubble(),
                schedule.chunks > 1 ? "virtual " : "", fmt::format("{}", fmt::join(c.layers_per_virtual_stage(), " ")).c_str());
    for (int r = 0; r < schedule.stages; ++r) {
      std::printf("  stage %d (activations of %d %s at most): %s\n", r, timeline.peak_in_flight[r],
                  schedule.chunks > 1 ? "(micro-batch, chunk) pairs" : "micro-batch(es)", schedule.describe(r).c_str());
    }
    for (int s = 0; s < schedule.stages; ++s) {
      std::printf("  stage %d on the device per rank: %s\n", s, format_bytes(plan_stage(c, s, 0).need.total(Tier::device)).c_str());
    }
  }
  // The stage that holds the most (the only one without a pipeline).
  const Plan& plan = largest.plan;
  const MemoryNeed& need = largest.need;
  if (c.parallel.pipeline > 1) std::printf("stage %d holds the most:\n", widest);
  plan.write_json_if_requested();
  std::printf("%s\n%s\n", plan.table().c_str(), plan.program_summary().c_str());
  std::printf("per rank on the device: %s\nin all: %s%s\n", need.describe(Tier::device).c_str(),
              format_bytes(need.total(Tier::device)).c_str(),
              c.run.device_memory > 0 ? fmt::format(" of the {} budget", format_bytes(c.run.device_memory)).c_str() : "");
  const size_t host = need.total(Tier::host) + need.total(Tier::pinned_host);
  if (host > 0) {
    std::printf("per rank in host memory: %s%s%s\nin all: %s%s\n", need.describe(Tier::host).c_str(),
                need.total(Tier::host) > 0 && need.total(Tier::pinned_host) > 0 ? "; pinned: " : "",
                need.describe(Tier::pinned_host).c_str(), format_bytes(host).c_str(),
                c.engine.host_memory > 0 ? fmt::format(" of the {} budget", format_bytes(c.engine.host_memory)).c_str() : "");
  }
  if (need.total(Tier::nvme) > 0) std::printf("per rank in swap files: %s\n", need.describe(Tier::nvme).c_str());
  // The run's own check: a plan over a budget is refused here too, with the same numbers, after
  // what was printed above.
  std::fflush(stdout);
  check_fits(need, plan, Tier::device, c.run.device_memory, 0, c.engine.device_budget_name);
  check_fits(need, plan, Tier::host, c.engine.host_memory, 0, c.engine.host_budget_name);
}

int run(Options& o) {
  TrainConfig c = load_run_config(o.run);
  resume_after_restart(c.run);
  if (const auto saved = saved_schedule_steps(c)) {
    // "auto" is run.steps; a resume that changes them keeps the schedule the run started on.
    std::fprintf(stderr,
                 "zeroth: warning: resuming with run.steps %lld where the checkpoint's run had scheduler.params.total_num_steps "
                 "%lld (\"auto\" in this config): the learning rate goes on along that schedule; set "
                 "scheduler.params.total_num_steps to reshape it\n",
                 static_cast<long long>(c.run.steps), static_cast<long long>(*saved));
    std::vector<std::string> overrides = o.run.overrides;
    overrides.push_back(fmt::format("scheduler.params.total_num_steps={}", *saved));
    const std::string resume = c.run.resume;
    c = load_run_config(o.run.config, overrides);
    c.run.resume = resume;
  }
  // A fault given for tests is read now, not at the first file it would concern.
  (void)offload::IoFault::for_file("");
  if (o.dry_run) {
    dry_run(c);
    return 0;
  }
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const auto launched = rendezvous_from_env();
  // Text to tokenize is tokenized here, once, before the run's memory is measured from.
  if (!c.data.tokenizer.empty()) check_data(c);
  std::unique_ptr<RunConsole> console;
  if (!launched || launched->rank == 0) console = make_console(c);
  bool interrupted = false;
  std::mutex mutex;
  std::string weights;
  try {
    on_every_rank(c, [&](Communicator& comm, Device& device) {
      const auto s = train(c, comm, device, comm.rank() == 0 ? console.get() : nullptr, &g_stop);
      std::lock_guard lock(mutex);
      interrupted = interrupted || s.interrupted;
      if (comm.rank() == 0) weights = s.weights_path;
    });
  } catch (const std::exception& e) {
    // The run's own error goes on; a report that cannot be written must not hide it.
    if (console) {
      try {
        console->on_failure(e.what());
      } catch (const std::exception& report_error) {
        std::fprintf(stderr, "zeroth: the run's report could not be written: %s\n", report_error.what());
      }
    }
    throw;
  }
  // A sample of what the weights say, on the launcher's rank 0 (or the threads' process).
  if (!interrupted && console && c.run.sample_tokens > 0 && !weights.empty() &&
      (c.data.format == DataFormat::text || !c.data.tokenizer.empty())) {
    TrainConfig from = c;
    from.run.init_from = weights;
    from.run.resume.clear();
    GenerateOptions o;
    o.max_new_tokens = c.run.sample_tokens, o.temperature = 0.8, o.top_k = 40, o.seed = c.run.seed;
    std::printf("  sample (%d tokens at temperature 0.8, top-k 40, from %s):\n", c.run.sample_tokens, weights.c_str());
    std::fflush(stdout);
    // The run is done and saved: a sample that cannot be taken (one rank cannot hold the whole
    // model in run.device_memory) is said, not an error.
    try {
      generate(from, o, [](std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      });
      std::printf("\n");
    } catch (const Error& e) {
      std::printf("  (not taken: %s)\n", e.what());
    }
  }
  return interrupted ? 130 : 0;
}

}  // namespace train_cmd

void add_train_command(CLI::App& app) {
  using namespace train_cmd;
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("train", "Train a model (GPT-2, the Llama family, mixture of experts) from a JSON config "
                                          "(DeepSpeed's keys plus model, data, run) or a run's folder");
  add_run_config_options(cmd, o->run, "Continue from", "The run's JSON config (see configs/), or a run's folder (its config.json)",
                         "--set zero_optimization.stage=2 --set run.steps=50");
  cmd->add_flag("--dry-run", o->dry_run, "Print the resolved config and the per-rank memory plan, then exit");
  cmd->callback([o] {
    const int code = run(*o);
    if (code != 0) std::exit(code);
  });
}

}  // namespace zeroth::tools
