// The report of a run: one self-contained HTML file (inline SVG and CSS, two lines of script for
// the toggles, nothing fetched) made from what the run leaves in its folder: metrics.jsonl (the
// start record with the plan, every step, validation and checkpoint record, the summary),
// config.json and, for pipelines with run.trace, trace.json. Loss against steps and tokens,
// learning rate, gradient norm, loss scale and skipped steps, throughput, the step's breakdown,
// memory by tier and tag (planned against measured), the pipeline's last step as a Gantt chart,
// the experts' load, the program, the start box and the resolved config. Several runs go on the
// same axes. Long runs are thinned to a bounded number of points per series (minima, maxima and
// spikes kept), so a report stays small.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

namespace zeroth::report {

// The report of the run in `dir`, with the runs in `others` drawn beside it. IoError when a folder
// holds no metrics.jsonl.
std::string run_report_html(const std::string& dir, const std::vector<std::string>& others = {});

// Writes run_report_html to `out` whole (a temporary file renamed over it).
void write_run_report(const std::string& dir, const std::string& out, const std::vector<std::string>& others = {});

}  // namespace zeroth::report
