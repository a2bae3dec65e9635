// The report's reader of metrics.jsonl against lines written here by hand, each record's fields
// known: the last record of each step kept whole, validations apart, a resumed run's start
// clearing how the earlier attempt ended, cut lines skipped, values that are not numbers as NaN.
#include <gtest/gtest.h>

#include <cmath>       // std::isnan
#include <cstdint>     // int64_t
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <unistd.h>  // getpid

#include "core/error.h"
#include "train/report/run_records.h"

namespace zeroth::report {
namespace {

using Column = std::vector<std::pair<int64_t, double>>;

std::string folder_with(const std::string& name, const std::string& lines) {
  const std::string dir = ::testing::TempDir() + "zeroth_run_records_" + name + "_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/metrics.jsonl") << lines;
  return dir;
}

TEST(RunRecords, ARestartedRunKeepsTheLastRecordOfEachStepWhole) {
  const std::string dir = folder_with("restart",
                                      R"({"start":{"tokens_per_step":64,"rows":[["model","a"]]}}
{"step":1,"loss":4.0,"lr":0.1,"skipped":false,"loss_scale":65536.0}
{"step":2,"loss":3.5,"lr":0.2,"skipped":true,"loss_scale":32768.0,"forward_ms":9.0}
{"step":2,"val_loss":3.75,"val_tokens":128}
{"step":3,"loss":null,"lr":0.3,"skipped":false,"loss_scale":32768.0,"experts":[1,2,{"a":3}],"forward_ms":8.0}
{"error":"rank 1 died"}
{"step":4,"loss":3.)"
                                      "\n"
                                      R"({"start":{"tokens_per_step":64}}
{"step":3,"loss":3.25,"lr":0.35,"optimizer_in_backward":"exact"}
{"step":4,"loss":3.0,"lr":0.4}
{"checkpoint":"step_4","step":4,"loss":99.0}
{"step":4.5,"loss":98.0}
{"summary":{"peak_rss_bytes":1024}}
)");
  const RunRecords r = read_run_records(dir);
  EXPECT_EQ(r.steps.column("loss"), (Column{{1, 4.0}, {2, 3.5}, {3, 3.25}, {4, 3.0}}));
  EXPECT_EQ(r.steps.column("lr"), (Column{{1, 0.1}, {2, 0.2}, {3, 0.35}, {4, 0.4}}));
  // Step 3's first record had forward_ms; the redone record, kept whole, has not.
  EXPECT_EQ(r.steps.column("forward_ms"), (Column{{2, 9.0}}));
  EXPECT_EQ(r.steps.column("skipped"), (Column{{1, 0.0}, {2, 1.0}}));
  EXPECT_TRUE(r.steps.has("loss_scale"));
  EXPECT_FALSE(r.steps.has("experts")) << "only step 3's first record had it";
  EXPECT_FALSE(r.steps.has("val_loss"));
  const Column strings = r.steps.column("optimizer_in_backward");
  ASSERT_EQ(strings.size(), 1u);
  EXPECT_EQ(strings[0].first, 3);
  EXPECT_TRUE(std::isnan(strings[0].second));
  EXPECT_EQ(r.steps.last_step(), 4);
  EXPECT_EQ(r.steps.last("loss"), 3.0);
  EXPECT_TRUE(std::isnan(r.steps.last("forward_ms")));
  EXPECT_EQ(r.evals.column("val_loss"), (Column{{2, 3.75}}));
  EXPECT_EQ(r.evals.last_step(), 2);
  // The second start replaced the first and cleared the error of the attempt before it.
  EXPECT_EQ(r.start, nlohmann::json::parse(R"({"tokens_per_step":64})"));
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.summary, nlohmann::json::parse(R"({"peak_rss_bytes":1024})"));
}

TEST(RunRecords, AFailedRunKeepsItsErrorAndNoSummary) {
  const RunRecords r = read_run_records(folder_with("failed", R"({"start":{}}
{"summary":{"steps":0}}
{"start":{}}
{"step":1,"loss":5.0,"grad_norm":null}
{"error":{"what":"disk full"}}
)"));
  EXPECT_EQ(r.error, R"({"what":"disk full"})");
  EXPECT_TRUE(r.summary.is_null());
  EXPECT_EQ(r.steps.column("loss"), (Column{{1, 5.0}}));
  EXPECT_TRUE(std::isnan(r.steps.last("grad_norm")));
  EXPECT_TRUE(r.steps.has("grad_norm"));
  EXPECT_TRUE(r.evals.empty());
  EXPECT_TRUE(r.evals.column("val_loss").empty());
  EXPECT_TRUE(std::isnan(r.evals.last("val_loss")));
}

TEST(RunRecords, AFolderWithoutMetricsIsAnError) {
  const std::string dir = ::testing::TempDir();
  try {
    read_run_records(dir + "/no_such_run_folder");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl cannot be read: give the folder of a zeroth run"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zeroth::report
