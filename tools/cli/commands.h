// The subcommands of the `zeroth` binary; each file registers one on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace zeroth::tools {

void add_report_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_estimate_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_report_run_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_data_preview_command(CLI::App& app);
// Registered last: it lists the commands registered before it.
void add_help_command(CLI::App& app);

}  // namespace zeroth::tools
