// What rank 0 of `zeroth train` shows and keeps of a run: the config box, the step lines (or a
// progress bar on a terminal), validation and checkpoint lines and the summary on stdout; every
// record in <output_dir>/metrics.jsonl, the resolved config in config.json, the pipeline trace,
// report.html (train/report/run_report.h) at each validation and the end, also after Ctrl-C or an
// error; and DeepSpeed's monitors (train/report/monitors.h) where the config turns them on.
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string

#include "train/report/box.h"  // tensor_line
#include "train/trainer.h"     // TrainObserver, TrainConfig

namespace zeroth::tools {

class RunConsole : public TrainObserver {
 public:
  // The run ended with an error (`what`): recorded in metrics.jsonl and the report, once the run
  // has started (before, the folder still holds the last run's files).
  virtual void on_failure(const std::string& what) = 0;
};

// The output folder must be writable before the ranks start; what an earlier run left there is
// replaced only once this run has passed its checks (on_start), so a refused run loses nothing.
std::unique_ptr<RunConsole> make_console(const TrainConfig& c);

}  // namespace zeroth::tools
