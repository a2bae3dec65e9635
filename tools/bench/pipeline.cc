// `zeroth bench pipeline`: the bubble the pipeline runner measures on the wall clock next to the
// papers' formula, for GPipe, 1F1B and interleaved 1F1B. The stages are a model: each pass sleeps
// on its rank's compute stream (forward one unit, backward two, a chunk its share), so p stages run
// side by side on any number of cores and the runner's own cost (events, channels, stamps) is what
// separates the measured bubble from the formula's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/pipeline/runner.h"
#include "tools/bench/bench.h"

namespace zeroth::tools {
namespace bench_pipeline {

struct Options {
  int stages = 4;
  std::vector<int> micro_batches = {4, 8, 16};
  double unit_ms = 10;
  int reps = 3;
  bool json = false;
};

void run(const Options& o) {
  if (o.stages < 2 || o.reps < 1 || o.unit_ms <= 0) {
    ZEROTH_THROW(InvalidArgument, "bench pipeline: --stages must be at least 2, --reps at least 1 and --unit-ms positive");
  }
  const auto unit = std::chrono::microseconds(static_cast<int64_t>(o.unit_ms * 1000));
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("# pipeline bubble, p = %d stages of sleeping passes (forward %.3g ms, backward %.3g ms per micro-batch; a model of\n"
                "# the work), %d cycles each: median [min, max] of the measured bubble next to the formula\n",
                o.stages, o.unit_ms, 2 * o.unit_ms, o.reps);
    std::printf("%-12s %4s %26s %9s %9s %11s\n", "schedule", "m", "measured", "formula", "vs formula", "makespan s");
  }
  for (PipeKind kind : {PipeKind::gpipe, PipeKind::one_f_one_b, PipeKind::interleaved}) {
    for (int m : o.micro_batches) {
      if (kind == PipeKind::interleaved && m % o.stages != 0) continue;  // Megatron's interleaving needs m a multiple of p
      std::vector<double> bubbles, makespans;
      double formula = 0;
      for (int r = 0; r < o.reps; ++r) {
        const auto got = measure_sleeping_pipeline(kind, o.stages, m, unit);
        bubbles.push_back(got.bubble);
        makespans.push_back(got.makespan);
        formula = got.formula;
      }
      std::sort(bubbles.begin(), bubbles.end());
      std::sort(makespans.begin(), makespans.end());
      const double median = bubbles[bubbles.size() / 2];
      const double diff = formula > 0 ? (median - formula) / formula : 0;
      rows.push_back({{"schedule", pipe_kind_name(kind)},
                      {"stages", o.stages},
                      {"micro_batches", m},
                      {"bubble_median", median},
                      {"bubble_min", bubbles.front()},
                      {"bubble_max", bubbles.back()},
                      {"formula", formula},
                      {"makespan_seconds", makespans[makespans.size() / 2]}});
      if (!o.json) {
        std::printf("%-12s %4d %8.4f [%.4f, %.4f] %9.4f %+8.1f%% %11.3f\n", pipe_kind_name(kind).data(), m, median, bubbles.front(),
                    bubbles.back(), formula, 100 * diff, makespans[makespans.size() / 2]);
      }
    }
  }
  if (o.json) std::printf("%s\n", nlohmann::json{{"pipeline", rows}}.dump(2).c_str());
}

}  // namespace bench_pipeline

void add_bench_pipeline_command(CLI::App& bench) {
  using namespace bench_pipeline;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("pipeline", "Measured pipeline bubble of GPipe, 1F1B and interleaved 1F1B next to the formula");
  cmd->add_option("--stages", options->stages, "Pipeline stages p (default 4)");
  cmd->add_option("--micro-batches", options->micro_batches, "Micro-batches m per cycle (default 4 8 16)");
  cmd->add_option("--unit-ms", options->unit_ms, "Milliseconds a forward pass sleeps; a backward sleeps twice that (default 10)");
  cmd->add_option("--reps", options->reps, "Cycles per row; the median is reported with the range (default 3)");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
