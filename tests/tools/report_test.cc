// The run report (report.html) against Chromium and the run's own records: Debian's chromium
// opens it headless and offline with no console message; the DOM it rendered, read by
// tests/reference/report_dom.py, holds every chart with its axes and as many points as
// metrics.jsonl has records; the toggles switch what is drawn when clicked in the browser; a
// screenshot is not blank. Also a pipeline run's timeline, runs compared on the same axes, the
// report of a run ended by an error, and a 100k-step run's report kept small.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::json;
using testing::temp;

// Chromium headless on `page` with `what` (--dump-dom, --screenshot=FILE): its exit code, and its
// log (console messages included) in `log`. Each call has a profile of its own: ctest runs cases
// side by side.
int chromium(const std::string& page, const std::string& what, const std::string& out, const std::string& name, std::string& log) {
  const std::string profile = temp(name + "_profile"), log_path = temp(name + "_chromium.log");
  const std::string cmd = "exec chromium --headless=new --no-sandbox --disable-gpu --allow-file-access-from-files "
                          "--enable-logging=stderr --v=0 --window-size=1440,2400 --user-data-dir=" +
                          profile + " " + what + " file://" + page + " >" + out + " 2>" + log_path;
  auto c = testing::spawn({"/bin/sh", "-c", cmd}, {}, temp(name + "_sh.out"));
  const int code = testing::wait_exit(c, 120s);
  log = testing::bytes_of(log_path);
  std::filesystem::remove_all(profile);
  return code;
}

// The report's DOM as Chromium rendered it, summarized by the independent reader.
json rendered(const std::string& report, const std::string& name) {
  std::string log;
  const std::string dom = temp(name + "_dom.html");
  EXPECT_EQ(chromium(report, "--dump-dom", dom, name, log), 0) << log;
  EXPECT_EQ(log.find(":CONSOLE"), std::string::npos) << "the page logged to its console:\n" << log;
  auto reader = testing::spawn({"/usr/bin/python3", std::string(ZEROTH_SOURCE_DIR) + "/tests/reference/report_dom.py", dom}, {},
                               temp(name + "_reader.out"));
  EXPECT_EQ(testing::wait_exit(reader, 60s), 0) << reader.output();
  return json::parse(reader.output());
}

// The figure's lines of `series` drawn in `classes` ("lin raw").
std::vector<json> lines(const json& figure, const std::string& series, const std::string& classes) {
  std::vector<json> out;
  for (const auto& l : figure["lines"]) {
    std::string c = l["classes"][0].get<std::string>() + " " + l["classes"][1].get<std::string>();
    if (l["series"] == series && c == classes) out.push_back(l);
  }
  return out;
}

std::vector<json> records_with(const std::string& name, const char* key) {
  std::vector<json> out;
  for (auto& m : testing::metrics_in(name))
    if (m.contains(key) && m.contains("step")) out.push_back(m);
  return out;
}

std::string tiny_with_breakdown(const std::string& name) {
  json j = json::parse(testing::bytes_of(testing::tiny_config(name, 6, "local", {{"eval_interval", 3}})));
  j["wall_clock_breakdown"] = true;
  return testing::write_config(name, j);
}

TEST(Report, AShortRunsReportOpensInChromiumWithEveryChartAndPoint) {
  const std::string name = "report_short";
  const auto r = testing::run({ZEROTH_BIN, "train", tiny_with_breakdown(name)}, name);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string report = temp(name) + "/report.html";
  EXPECT_NE(r.output.find("report: " + report), std::string::npos) << r.output;
  const std::string html = testing::bytes_of(report);
  ASSERT_FALSE(html.empty());
  EXPECT_EQ(html.find("http://"), std::string::npos) << "the report fetches something";
  EXPECT_EQ(html.find("https://"), std::string::npos) << "the report fetches something";

  const json dom = rendered(report, name);
  const auto steps = records_with(name, "lr"), evals = records_with(name, "val_loss");
  ASSERT_EQ(steps.size(), 6u);
  for (const std::string id : {"loss", "lr", "grad_norm", "throughput", "breakdown", "peak"}) {
    SCOPED_TRACE(id);
    ASSERT_TRUE(dom.at("figures").contains(id)) << dom.dump();
    EXPECT_EQ(dom.at("figures").at(id).at("axes").at("x"), 1);
    EXPECT_GE(dom.at("figures").at(id).at("axes").at("y").get<int>(), 1);
  }
  const json& loss = dom.at("figures").at("loss");
  for (const std::string classes : {"lin raw", "lin smooth", "log raw", "log smooth"}) {
    const auto l = lines(loss, "training loss", classes);
    ASSERT_EQ(l.size(), 1u) << classes;
    EXPECT_EQ(l[0]["recorded"], steps.size()) << classes;
    EXPECT_EQ(l[0]["drawn"], steps.size()) << classes;
    EXPECT_EQ(l[0]["points"], steps.size()) << classes;
  }
  ASSERT_EQ(loss["markers"].size(), 2u);  // validation losses, linear and log
  EXPECT_EQ(loss["markers"][0]["circles"], evals.size());
  EXPECT_EQ(dom.at("figures").at("breakdown").at("areas"), 4);  // forward, backward, reduce wait, optimizer
  for (const std::string section : {"memory", "start", "program", "config"})
    EXPECT_NE(dom.at("sections").dump().find(section), std::string::npos) << section;

  // The toggles, clicked in the browser: the loss chart shows one variant of its line at a time.
  const std::string page = temp(name) + "/toggles.html";
  std::ofstream(page) << R"(<html><body><pre id="out"></pre><iframe src="report.html" onload="
var d=this.contentDocument, out={};
function shown(){return Array.from(d.querySelectorAll('#loss polyline')).filter(function(p){return getComputedStyle(p).display!='none'}).map(function(p){return p.getAttribute('class')});}
out.start=shown(); var boxes=d.querySelectorAll('#loss input');
boxes[0].click(); out.log=shown(); boxes[1].click(); out.log_smooth=shown(); boxes[0].click(); out.smooth=shown();
document.getElementById('out').textContent=JSON.stringify(out);"></iframe></body></html>)";
  std::string log;
  const std::string dom_path = temp(name + "_toggles.html");
  ASSERT_EQ(chromium(page, "--dump-dom", dom_path, name + "_t", log), 0) << log;
  const std::string dumped = testing::bytes_of(dom_path);
  const auto at = dumped.find("<pre id=\"out\">");
  ASSERT_NE(at, std::string::npos) << dumped;
  const auto from = at + 14;
  const json shown = json::parse(dumped.substr(from, dumped.find("</pre>", from) - from));
  EXPECT_EQ(shown["start"], json::array({"lin raw"}));
  EXPECT_EQ(shown["log"], json::array({"log raw"}));
  EXPECT_EQ(shown["log_smooth"], json::array({"log smooth"}));
  EXPECT_EQ(shown["smooth"], json::array({"lin smooth"}));

  // A screenshot that is not blank: far larger than one of an empty page of the same size.
  std::ofstream(temp(name) + "/empty.html") << "<html><body></body></html>";
  std::string ignored;
  ASSERT_EQ(chromium(temp(name) + "/empty.html", "--screenshot=" + temp(name) + "/empty.png", "/dev/null", name + "_e", ignored), 0);
  ASSERT_EQ(chromium(report, "--screenshot=" + temp(name) + "/report.png", "/dev/null", name + "_s", ignored), 0);
  const auto blank = std::filesystem::file_size(temp(name) + "/empty.png"),
             shot = std::filesystem::file_size(temp(name) + "/report.png");
  std::printf("screenshot of the report: %ju bytes, of an empty page: %ju bytes\n", static_cast<uintmax_t>(shot),
              static_cast<uintmax_t>(blank));
  EXPECT_GT(shot, 5 * blank);
}

TEST(Report, APipelineRunsReportDrawsItsLastStepPerStage) {
  const std::string name = "report_pipeline";
  std::filesystem::remove_all(temp(name));
  const auto r = testing::run({ZEROTH_BIN, "train", std::string(ZEROTH_SOURCE_DIR) + "/configs/gpt-pipeline-1f1b.json", "--set",
                               "run.steps=3", "--set", "run.eval_interval=0", "--set", "run.sample_tokens=0", "--set",
                               "run.output_dir=" + temp(name)},
                              name);
  ASSERT_EQ(r.code, 0) << r.output;
  const json trace = json::parse(testing::bytes_of(temp(name) + "/trace.json"));
  int compute = 0;
  for (const auto& e : trace["traceEvents"]) compute += e.value("ph", "") == "X" && e.value("tid", -1) == 0;
  ASSERT_GT(compute, 0);
  const json dom = rendered(temp(name) + "/report.html", name);
  ASSERT_TRUE(dom.at("figures").contains("pipeline")) << dom.dump();
  EXPECT_EQ(dom.at("figures").at("pipeline").at("rects"), compute);
  EXPECT_EQ(dom.at("figures").at("pipeline").at("axes").at("x"), 1);
}

TEST(Report, RunsComparedShareTheAxes) {
  std::vector<std::string> dirs;
  for (const std::string run : {"report_a", "report_b"}) {
    json j = json::parse(testing::bytes_of(testing::tiny_config(run, 4, "local")));
    if (run == "report_b") j["optimizer"]["params"]["lr"] = 5e-3;
    const auto r = testing::run({ZEROTH_BIN, "train", testing::write_config(run, j)}, run);
    ASSERT_EQ(r.code, 0) << r.output;
    dirs.push_back(temp(run));
  }
  const std::string out = temp("report_compared.html");
  const auto r = testing::run({ZEROTH_BIN, "report-run", dirs[0], "--compare", dirs[1], "--out", out}, "report_compare");
  ASSERT_EQ(r.code, 0) << r.output;
  const json dom = rendered(out, "report_compare");
  int training = 0;
  for (const auto& l : dom.at("figures").at("loss").at("lines"))
    training += l["series"].get<std::string>().ends_with(": training loss") && l["classes"][0] == "lin" && l["classes"][1] == "raw";
  EXPECT_EQ(training, 2);
  EXPECT_NE(dom.at("title").get<std::string>().find("zeroth run report"), std::string::npos);
}

TEST(Report, TheReportOfARunEndedByAnErrorStillOpens) {
  const std::string name = "report_error";
  const std::string cfg = testing::tiny_config(name, 6, "local", {{"checkpoint_interval", 2}});
  auto child = testing::spawn({ZEROTH_BIN, "train", cfg}, {"ZEROTH_IO_FAULT=write:ENOSPC:0:.tmp-step-4/rank-00001.bin"},
                              temp(name) + ".out");
  ASSERT_EQ(testing::wait_exit(child, 120s), 1) << child.output();
  const std::string html = testing::bytes_of(temp(name) + "/report.html");
  EXPECT_NE(html.find("ended with an error: "), std::string::npos);
  EXPECT_NE(html.find("saving the checkpoint"), std::string::npos);
  const json dom = rendered(temp(name) + "/report.html", name);
  EXPECT_EQ(lines(dom.at("figures").at("loss"), "training loss", "lin raw").at(0)["recorded"], 4);  // the steps before the failed save
}

// 100k steps of records, with one spike: the report stays under 5 MB and keeps the spike.
TEST(Report, AHundredThousandStepRunsReportStaysSmallAndKeepsItsSpikes) {
  const std::string dir = temp("report_long");
  std::filesystem::create_directories(dir);
  {
    std::ofstream m(dir + "/metrics.jsonl");
    for (int step = 1; step <= 100000; ++step) {
      const double loss = step == 77777 ? 50.0 : 4.0 / (1 + step * 1e-4);
      m << json{{"step", step}, {"loss", loss}, {"lr", 1e-3}, {"grad_norm", 1.0}, {"tokens_per_s", 1e5}, {"peak_bytes", 1 << 20}}
               .dump()
        << "\n";
    }
  }
  const auto started = std::chrono::steady_clock::now();
  const auto r = testing::run({ZEROTH_BIN, "report-run", dir}, "report_long");
  ASSERT_EQ(r.code, 0) << r.output;
  std::printf("report of 100k steps: %.2f s (printed, not asserted: ctest runs cases side by side)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  const auto size = std::filesystem::file_size(dir + "/report.html");
  std::printf("report size: %ju bytes\n", static_cast<uintmax_t>(size));
  EXPECT_LT(size, 5u << 20);
  const std::string html = testing::bytes_of(dir + "/report.html");
  // The spike's point: y of 50 at the top of the linear loss chart's frame (kTop = 28).
  const auto loss = html.find("data-series=\"training loss\"");
  ASSERT_NE(loss, std::string::npos);
  const auto points = html.substr(loss, html.find("/>", loss) - loss);
  EXPECT_NE(points.find(",28.0"), std::string::npos) << "the spike was thinned away";
}

}  // namespace
}  // namespace zeroth
