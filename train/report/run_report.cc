#include "train/report/run_report.h"

#include <cerrno>      // errno
#include <cmath>       // std::isfinite
#include <cstdio>      // std::rename
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <map>         // std::map
#include <utility>     // std::move

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"  // format_bytes
#include "train/report/run_records.h"
#include "train/report/svg_chart.h"

namespace zeroth::report {

namespace {

using json = nlohmann::json;

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
// The step's parts (wall_clock_breakdown) and their colors.
constexpr std::pair<const char*, const char*> kParts[] = {{"forward_ms", "#4e79a7"},
                                                          {"backward_ms", "#f28e2b"},
                                                          {"reduce_wait_ms", "#e15759"},
                                                          {"optimizer_ms", "#76b7b2"}};

// What one run folder holds, with how the report names and colors it.
struct RunData : RunRecords {
  std::string dir, name, color;
  json config, trace;
  double tokens_per_step = 0;
};

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  return json::parse(in, nullptr, false);
}

RunData read_run(const std::string& dir, size_t index) {
  RunData r;
  static_cast<RunRecords&>(r) = read_run_records(dir);
  r.dir = dir;
  r.color = kColors[index % std::size(kColors)];
  r.config = read_json_file(dir + "/config.json");
  r.trace = read_json_file(dir + "/trace.json");
  r.name = std::filesystem::path(dir).filename().string();
  if (r.config.is_object() && r.config.contains("run") && r.config["run"].contains("name") && r.config["run"]["name"].is_string()) {
    // The folder beside the run's name where they differ: runs of one config compared side by side.
    const std::string name = r.config["run"]["name"].get<std::string>();
    if (name != r.name) r.name = name + " (" + r.name + ")";
  }
  if (r.start.is_object() && r.start.contains("tokens_per_step")) r.tokens_per_step = r.start["tokens_per_step"].get<double>();
  return r;
}

double number(const json& m, const char* key) {
  if (!m.contains(key) || !m[key].is_number()) return std::nan("");
  return m[key].get<double>();
}

// One series of a run's step records.
Series step_series(const RunData& r, const char* key, const std::string& name, const std::string& color = "") {
  Series s{name, {}, {}, color.empty() ? r.color : color};
  for (const auto& [step, v] : r.steps.column(key)) {
    s.x.push_back(static_cast<double>(step));
    s.y.push_back(v);
  }
  return s;
}

bool has(const RunData& r, const char* key) { return r.steps.has(key); }

bool any_has(const std::vector<RunData>& runs, const char* key) {
  for (const auto& r : runs)
    if (has(r, key)) return true;
  return false;
}

std::string label(const std::vector<RunData>& runs, const RunData& r, const std::string& what) {
  return runs.size() == 1 ? what : r.name + ": " + what;
}

Chart chart(const std::string& id, const std::string& title, const std::string& y, const RunData& first) {
  Chart c;
  c.id = id, c.title = title, c.x_label = "step", c.y_label = y;
  if (first.tokens_per_step > 0) c.top_scale = first.tokens_per_step, c.top_label = "tokens";
  return c;
}

std::string curves(const std::vector<RunData>& runs) {
  const RunData& first = runs.front();
  std::string out;
  std::vector<Series> loss;
  for (const auto& r : runs) {
    loss.push_back(step_series(r, "loss", label(runs, r, "training loss")));
    Series val{label(runs, r, "validation loss"), {}, {}, r.color, true, true};
    for (const auto& [step, v] : r.evals.column("val_loss")) val.x.push_back(static_cast<double>(step)), val.y.push_back(v);
    if (!val.x.empty()) loss.push_back(std::move(val));
  }
  Chart c = chart("loss", "Loss", "loss", first);
  c.log_toggle = c.smooth_toggle = true;
  out += line_chart(c, loss);
  const auto per_run =
      [&](const char* key, const std::string& id, const std::string& title, const std::string& y, bool log, bool smoothing) {
    if (!any_has(runs, key)) return;
    std::vector<Series> series;
    for (const auto& r : runs) series.push_back(step_series(r, key, label(runs, r, title)));
    Chart ch = chart(id, title, y, first);
    ch.log_toggle = log, ch.smooth_toggle = smoothing;
    out += line_chart(ch, series);
  };
  per_run("lr", "lr", "Learning rate", "lr", true, false);
  per_run("grad_norm", "grad_norm", "Gradient norm", "norm", true, true);
  // The loss scale where it moves (fp16), with the skipped steps marked on it.
  bool scaled = false;
  for (const auto& r : runs) {
    for (const auto& [step, v] : r.steps.column("loss_scale")) scaled = scaled || v != 1;
    for (const auto& [step, v] : r.steps.column("skipped")) scaled = scaled || v == 1;
  }
  if (scaled) {
    std::vector<Series> series;
    for (const auto& r : runs) {
      series.push_back(step_series(r, "loss_scale", label(runs, r, "loss scale")));
      Series skipped{label(runs, r, "skipped step (overflow)"), {}, {}, "#d62728", true, false};
      const auto scales = r.steps.column("loss_scale");
      const std::map<int64_t, double> scale_at(scales.begin(), scales.end());
      for (const auto& [step, v] : r.steps.column("skipped")) {
        if (v != 1) continue;
        const auto it = scale_at.find(step);
        skipped.x.push_back(static_cast<double>(step));
        skipped.y.push_back(it == scale_at.end() ? std::nan("") : it->second);
      }
      series.push_back(std::move(skipped));
    }
    Chart ch = chart("loss_scale", "Loss scale and skipped steps", "scale", first);
    ch.log_toggle = true;
    out += line_chart(ch, series);
  }
  per_run("tokens_per_s", "throughput", "Throughput", "tokens/s", false, true);
  per_run("mfu", "mfu", "Model FLOP utilization", "MFU", false, true);
  return out;
}

std::string breakdown(const RunData& r) {
  if (!has(r, "forward_ms")) return "";
  std::vector<Series> parts;
  for (const auto& [key, color] : kParts) {
    std::string name = key;
    name.resize(name.size() - 3);
    for (char& ch : name)
      if (ch == '_') ch = ' ';
    parts.push_back(step_series(r, key, name, color));
  }
  std::string out = stacked_chart(chart("breakdown", "Step time by part (wall_clock_breakdown)", "ms", r), parts);
  if (has(r, "swap_busy_ms"))
    out += line_chart(chart("swap", "Swap I/O: streams' busy time", "ms", r), {step_series(r, "swap_busy_ms", "swap busy")});
  return out;
}

// Planned bytes per tier and tag (the start record) against the measured peaks (the summary).
std::string memory(const std::vector<RunData>& runs) {
  const RunData& r = runs.front();
  std::vector<Series> peaks;
  for (const auto& run : runs) {
    Series s = step_series(run, "peak_bytes", label(runs, run, "device peak"));
    for (double& v : s.y) v /= 1 << 20;
    peaks.push_back(std::move(s));
  }
  std::string out = "<section id=\"memory\"><h2>Memory (rank 0)</h2>" +
                    line_chart(chart("peak", "Device memory at peak, per step", "MiB", r), peaks);
  if (!r.start.is_object() || !r.start.contains("planned_bytes")) return out + "</section>";
  const json& planned = r.start["planned_bytes"];
  const json measured = r.summary.is_object() ? r.summary.value("device_peak_bytes", json::object()) : json::object();
  out += "<table class=\"memory\"><tr><th>tier</th><th>tag</th><th>planned</th><th>measured peak</th></tr>";
  for (const auto& [tier, tags] : planned.items()) {
    for (const auto& [tag, bytes] : tags.items()) {
      if (bytes.get<double>() == 0 && !(tier == "device" && measured.contains(tag))) continue;
      std::string seen = "";
      if (tier == "device" && measured.contains(tag)) seen = format_bytes(measured[tag].get<std::size_t>());
      out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", escape(tier), escape(tag),
                         format_bytes(bytes.get<std::size_t>()), seen);
    }
  }
  if (r.summary.is_object()) {
    const auto row = [&](const char* what, const char* key) {
      if (number(r.summary, key) > 0)
        out += fmt::format("<tr><td colspan=\"3\">{}</td><td>{}</td></tr>", what,
                           format_bytes(static_cast<std::size_t>(number(r.summary, key))));
    };
    row("host memory the engine held (offload), at peak", "host_peak_bytes");
    row("swap files", "swap_disk_bytes");
    row("process resident set, at peak", "peak_rss_bytes");
  }
  return out + "</table></section>";
}

// The trace's compute spans of the last step, a lane per stage.
std::string pipeline(const RunData& r) {
  if (!r.trace.is_object() || !r.trace.contains("traceEvents")) return "";
  std::map<int, std::string> stages;
  std::vector<Span> spans;
  for (const auto& e : r.trace["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") stages[e["pid"].get<int>()] = e["args"]["name"];
    if (e.value("ph", "") != "X" || e.value("tid", -1) != 0) continue;
    const std::string name = e.value("name", "");
    const char* color = name.starts_with("F") ? "#4e79a7" : name.starts_with("B") ? "#f28e2b" : "#9c9c9c";
    spans.push_back(
        {e["pid"].get<int>(), e["ts"].get<double>() / 1e3, (e["ts"].get<double>() + e["dur"].get<double>()) / 1e3, name, color});
  }
  std::vector<std::string> rows;
  for (const auto& [pid, name] : stages) rows.push_back(name);
  Chart c;
  c.id = "pipeline", c.title = "Pipeline: the last step's compute per stage", c.x_label = "ms";
  std::string out = "<section id=\"pipeline-section\"><h2>Pipeline</h2>" + gantt_chart(c, rows, spans);
  if (r.trace.contains("otherData")) {
    const json& o = r.trace["otherData"];
    out += fmt::format("<p>Blue: a micro-batch's forward (F3), orange: its backward (B3), gray: other compute. Bubble {:.3f} "
                       "measured in this step, {:.3f} by the schedule's formula.</p>",
                       number(o, "bubble"), number(o, "bubble_formula"));
  }
  return out + "</section>";
}

std::string experts(const std::vector<RunData>& runs) {
  if (!any_has(runs, "moe_max_load")) return "";
  std::vector<Series> load, dropped;
  for (const auto& r : runs) {
    load.push_back(step_series(r, "moe_max_load", label(runs, r, "busiest expert / mean")));
    Series d = step_series(r, "moe_dropped", label(runs, r, "choices dropped"));
    for (double& v : d.y) v *= 100;
    dropped.push_back(std::move(d));
  }
  return "<section id=\"moe\"><h2>Experts</h2>" + line_chart(chart("moe_load", "Expert load", "rows / mean", runs.front()), load) +
         line_chart(chart("moe_dropped", "Choices dropped past capacity", "%", runs.front()), dropped) + "</section>";
}

std::string header(const RunData& r) {
  std::string status;
  if (!r.error.empty()) status = "ended with an error: " + r.error;
  else if (!r.summary.is_object()) status = "no summary yet: the run is going, or ended without one";
  else if (r.summary.value("interrupted", false)) status = "stopped (interrupted)";
  else status = "done";
  const int64_t last = r.steps.last_step();
  std::string out = fmt::format("<tr><td><i style=\"background:{}\"></i>{}</td><td>{}</td><td>{}</td>", r.color, escape(r.name),
                                escape(status), last);
  out += fmt::format("<td>{}</td>", r.steps.empty() ? "" : fmt::format("{:.4f}", r.steps.last("loss")));
  out += fmt::format("<td>{}</td><td>{}</td></tr>", r.evals.empty() ? "" : fmt::format("{:.4f}", r.evals.last("val_loss")),
                     escape(r.dir));
  return out;
}

std::string details(const RunData& r) {
  std::string out;
  if (r.start.is_object() && r.start.contains("rows")) {
    out += "<section id=\"start\"><h2>Start</h2><table class=\"start\">";
    for (const auto& row : r.start["rows"]) out += fmt::format("<tr><th>{}</th><td>{}</td></tr>", escape(row[0]), escape(row[1]));
    out += "</table></section>";
  }
  if (r.start.is_object() && r.start.contains("program"))
    out += "<section id=\"program\"><h2>Program</h2><pre>" + escape(r.start["program"].get<std::string>()) + "</pre></section>";
  if (r.config.is_object())
    out += "<section id=\"config\"><h2>Resolved config</h2><details><summary>config.json</summary><pre>" + escape(r.config.dump(2)) +
           "</pre></details></section>";
  return out;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1440px;color:#222;padding:0 16px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{margin:0;border:1px solid #ddd;border-radius:4px;padding:8px;width:660px;max-width:100%;break-inside:avoid}
figure.chart figcaption{font-weight:600;display:flex;gap:16px;align-items:center}
figure.chart figcaption label{font-weight:400;font-size:12px}
svg{width:100%;height:auto}svg text{font-size:11px;fill:#444}
.axis line{stroke:#888}.axis line.grid{stroke:#eee}
polyline{fill:none;stroke-width:1.5}polygon.area{opacity:.85}text.in{fill:#fff;font-size:9px}
.legend span{margin-right:12px;font-size:12px}.legend i,td i{display:inline-block;width:10px;height:10px;margin-right:4px}
figure[data-log="1"] .lin,figure[data-log="0"] .log,figure[data-smooth="1"] .raw,figure[data-smooth="0"] .smooth{display:none}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
@media print{figure[data-log] .smooth{display:none}}
)";

}  // namespace

std::string run_report_html(const std::string& dir, const std::vector<std::string>& others) {
  std::vector<RunData> runs;
  runs.push_back(read_run(dir, 0));
  for (size_t i = 0; i < others.size(); ++i) runs.push_back(read_run(others[i], i + 1));
  const RunData& r = runs.front();
  std::string html = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + escape(r.name) +
                     " - zeroth run report</title><style>" + kStyle + "</style></head><body>";
  html += "<h1>zeroth run report: " + escape(r.name) +
          "</h1><table class=\"runs\"><tr><th>run</th><th>status</th><th>last "
          "step</th><th>loss</th><th>validation</th><th>folder</th></tr>";
  for (const auto& run : runs) html += header(run);
  html += "</table><section id=\"curves\"><h2>Training</h2><div class=\"charts\">" + curves(runs) + breakdown(r) + "</div></section>";
  html += memory(runs) + pipeline(r) + experts(runs) + details(r);
  return html + "</body></html>\n";
}

void write_run_report(const std::string& dir, const std::string& out, const std::vector<std::string>& others) {
  const std::string html = run_report_html(dir, others);
  const std::string tmp = out + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) ZEROTH_THROW(IoError, "fopen({}, \"wb\") failed: {}", tmp, detail::errno_text(errno));
  const bool written = std::fwrite(html.data(), 1, html.size(), f) == html.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    ZEROTH_THROW(IoError, "writing {} ({} bytes) failed: {}; the disk may be full", tmp, html.size(), detail::errno_text(errno));
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0)
    ZEROTH_THROW(IoError, "rename({}, {}) failed: {}", tmp, out, detail::errno_text(errno));
}

}  // namespace zeroth::report
