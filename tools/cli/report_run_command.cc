// `zeroth report-run RUN_DIR [--compare RUN_DIR2]... [--out FILE]`: the HTML report of a run
// folder (train/report/run_report.h), other runs drawn on the same axes; RUN_DIR/report.html unless
// --out says otherwise.
#include <cstdio>  // std::printf
#include <memory>  // std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>

#include "train/report/run_report.h"  // write_run_report
#include "tools/cli/commands.h"

namespace zeroth::tools {

namespace report_run_cmd {

struct ReportRunOptions {
  std::string dir, out;
  std::vector<std::string> compare;
};

}  // namespace report_run_cmd

void add_report_run_command(CLI::App& app) {
  using namespace report_run_cmd;
  auto o = std::make_shared<ReportRunOptions>();
  auto* cmd = app.add_subcommand("report-run",
                                 "Write a run folder's report: one HTML file with its curves, step breakdown, memory by tier, "
                                 "pipeline timeline and config, readable offline");
  cmd->add_option("run_dir", o->dir, "The run's folder (its run.output_dir, holding metrics.jsonl)")->required();
  cmd->add_option("--compare", o->compare, "Another run's folder, drawn on the same axes (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--out", o->out, "Where to write the report (default: RUN_DIR/report.html)");
  cmd->callback([o] {
    const std::string out = o->out.empty() ? o->dir + "/report.html" : o->out;
    report::write_run_report(o->dir, out, o->compare);
    std::printf("report: %s\n", out.c_str());
  });
}

}  // namespace zeroth::tools
