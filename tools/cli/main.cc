// zeroth: the single entry point. Turns every error into one line and an exit code.
#include <cstdio>
#include <exception>

#include "core/error.h"  // zeroth::Error, detail::without_locations
#include "core/log.h"    // log::level
#include "tools/bench/bench.h"
#include "tools/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"zeroth: ZeRO training engine (stages 0-3, data-parallel over threads, processes or GPUs)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("zeroth ") + ZEROTH_VERSION);
  zeroth::tools::add_train_command(app);
  zeroth::tools::add_eval_command(app);
  zeroth::tools::add_report_run_command(app);
  zeroth::tools::add_tokenize_command(app);
  zeroth::tools::add_generate_command(app);
  zeroth::tools::add_data_preview_command(app);
  zeroth::tools::add_report_command(app);
  zeroth::tools::add_launch_command(app);
  zeroth::tools::add_ckpt_command(app);
  zeroth::tools::add_estimate_command(app);
  zeroth::tools::add_plan_command(app);
  auto* bench = app.add_subcommand("bench", "Measure kernels, communication, optimizers, the engine, training, offload I/O");
  bench->require_subcommand(1);
  zeroth::tools::add_bench_kernels_command(*bench);
  zeroth::tools::add_bench_attention_command(*bench);
  zeroth::tools::add_bench_comm_command(*bench);
  zeroth::tools::add_bench_optim_command(*bench);
  zeroth::tools::add_bench_engine_command(*bench);
  zeroth::tools::add_bench_train_command(*bench);
  zeroth::tools::add_bench_offload_command(*bench);
  zeroth::tools::add_bench_offload_step_command(*bench);
  zeroth::tools::add_bench_ckpt_command(*bench);
  zeroth::tools::add_bench_pipeline_command(*bench);
  zeroth::tools::add_help_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const zeroth::Error& e) {
    // Where in zeroth's sources the error was raised is for its developers: shown at debug level.
    const bool locations = zeroth::log::level() <= zeroth::log::Level::debug;
    std::fprintf(stderr, "zeroth: error: %s\n", locations ? e.what() : zeroth::detail::without_locations(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroth: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
