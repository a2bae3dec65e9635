// DeepSpeed's monitors against an independent reader: a run with `tensorboard` and `csv_monitor`
// on (fp16, so the loss scale is there, and wall_clock_breakdown), its event file read by
// tests/reference/tfevents_read.py (the TFRecord framing checked with python3-crcmod's CRC-32C,
// each Event parsed by python3-protobuf), and its CSV files: every scalar at every step equals
// metrics.jsonl's, as a float32 in the event file and exactly in the CSV; a resumed run appends.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::json;
using testing::temp;

// Each tag and the metrics.jsonl key it carries (elapsed_time_ms_backward is the sum of two).
const std::vector<std::pair<std::string, std::string>> kTags = {
    {"Train/Samples/train_loss", "loss"},
    {"Train/Samples/lr", "lr"},
    {"Train/Samples/grad_norm", "grad_norm"},
    {"Train/Samples/tokens_per_s", "tokens_per_s"},
    {"Train/Samples/loss_scale", "loss_scale"},
    {"Train/Samples/elapsed_time_ms_forward", "forward_ms"},
    {"Train/Samples/elapsed_time_ms_backward_inner", "backward_ms"},
    {"Train/Samples/elapsed_time_ms_backward_allreduce", "reduce_wait_ms"},
    {"Train/Samples/elapsed_time_ms_step", "optimizer_ms"},
};

double value_of(const json& m, const std::string& key) {
  if (key == "backward") return m["backward_ms"].get<double>() + m["reduce_wait_ms"].get<double>();
  return m[key].get<double>();
}

// The run's step records (with loss and lr) and validation records, by x (samples).
struct Records {
  std::map<int64_t, json> steps, evals;
};
Records records(const std::string& name, int64_t batch) {
  Records r;
  for (auto& m : testing::metrics_in(name)) {
    if (m.contains("loss") && m.contains("lr")) r.steps[m["step"].get<int64_t>() * batch] = m;
    if (m.contains("val_loss")) r.evals[m["step"].get<int64_t>() * batch] = m;
  }
  return r;
}

std::string monitored_config(const std::string& name) {
  json j = json::parse(testing::bytes_of(testing::tiny_config(name, 6, "local", {{"eval_interval", 3}})));
  j["fp16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 12}};
  j["wall_clock_breakdown"] = true;
  j["tensorboard"] = {{"enabled", true}, {"job_name", "tb"}};  // into run.output_dir
  j["csv_monitor"] = {{"enabled", true}, {"output_path", temp(name) + "_csv"}, {"job_name", "job"}};
  std::filesystem::remove_all(temp(name) + "_csv");
  return testing::write_config(name, j);
}

// The scalars the reader finds in the run's event files, by step (a step's and its validation's
// records merged); the file versions it read.
std::map<int64_t, json> read_events(const std::string& dir, std::vector<std::string>& versions, int& files) {
  std::map<int64_t, json> by_step;
  files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.path().filename().string().starts_with("events.out.tfevents.")) continue;
    ++files;
    auto reader = testing::spawn({"/usr/bin/python3", std::string(ZEROTH_SOURCE_DIR) + "/tests/reference/tfevents_read.py",
                                  entry.path()},
                                 {}, temp("monitors_reader.out"));
    EXPECT_EQ(testing::wait_exit(reader, 60s), 0) << reader.output();
    std::istringstream lines(reader.output());
    for (std::string line; std::getline(lines, line);) {
      const json e = json::parse(line);
      if (e.contains("file_version")) versions.push_back(e["file_version"]);
      else by_step[e["step"].get<int64_t>()].update(e["scalars"]);
    }
  }
  return by_step;
}

// One CSV file: its header, and its rows by x.
std::map<int64_t, double> read_csv(const std::string& path, std::string& header, int& headers) {
  std::map<int64_t, double> rows;
  std::ifstream in(path);
  headers = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("step,")) {
      header = line, ++headers;
      continue;
    }
    const auto comma = line.find(',');
    rows[std::stoll(line.substr(0, comma))] = std::stod(line.substr(comma + 1));
  }
  return rows;
}

TEST(Monitors, TensorBoardAndCsvFilesHoldEveryScalarOfMetricsJsonl) {
  const std::string name = "monitors";
  const std::string cfg = monitored_config(name);
  const auto first = testing::run({ZEROTH_BIN, "train", cfg}, name);
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("monitor    tensorboard: " + temp(name) + "/tb"), std::string::npos) << first.output;
  // Resumed for 2 more steps: the CSV files go on, a second event file joins the first.
  const auto second = testing::run({ZEROTH_BIN, "train", cfg, "--set", "run.steps=8", "--resume"}, name);
  ASSERT_EQ(second.code, 0) << second.output;

  const int64_t batch = json::parse(testing::bytes_of(temp(name) + "/config.json"))["train_batch_size"];
  const auto r = records(name, batch);
  ASSERT_EQ(r.steps.size(), 8u);
  ASSERT_EQ(r.evals.size(), 4u);  // steps 0 (the start), 3, 6 and 8

  std::vector<std::string> versions;
  int files = 0;
  const auto events = read_events(temp(name) + "/tb", versions, files);
  EXPECT_EQ(files, 2);
  EXPECT_EQ(versions, std::vector<std::string>(2, "brain.Event:2"));
  for (const auto& [x, m] : r.steps) {
    SCOPED_TRACE("step " + std::to_string(m["step"].get<int>()));
    ASSERT_TRUE(events.contains(x));
    const json& s = events.at(x);
    for (const auto& [tag, key] : kTags) EXPECT_EQ(s.at(tag).get<double>(), static_cast<float>(value_of(m, key))) << tag;
    EXPECT_FLOAT_EQ(s.at("Train/Samples/elapsed_time_ms_backward").get<float>(), static_cast<float>(value_of(m, "backward")));
  }
  for (const auto& [x, m] : r.evals) {
    ASSERT_TRUE(events.contains(x));
    EXPECT_EQ(events.at(x).at("Eval/Samples/val_loss").get<double>(), static_cast<float>(m["val_loss"].get<double>()));
  }

  for (const auto& [tag, key] : kTags) {
    SCOPED_TRACE(tag);
    std::string file = tag, header;
    for (char& ch : file)
      if (ch == '/') ch = '_';
    int headers = 0;
    const auto rows = read_csv(temp(name) + "_csv/job/" + file + ".csv", header, headers);
    EXPECT_EQ(headers, 1);
    EXPECT_EQ(header, "step," + tag.substr(tag.rfind('/') + 1));
    ASSERT_EQ(rows.size(), r.steps.size());
    for (const auto& [x, m] : r.steps) EXPECT_EQ(rows.at(x), value_of(m, key)) << "x " << x;
  }
  std::string header;
  int headers = 0;
  const auto val = read_csv(temp(name) + "_csv/job/Eval_Samples_val_loss.csv", header, headers);
  ASSERT_EQ(val.size(), r.evals.size());
  for (const auto& [x, m] : r.evals) EXPECT_EQ(val.at(x), m["val_loss"].get<double>()) << "x " << x;
}

}  // namespace
}  // namespace zeroth
