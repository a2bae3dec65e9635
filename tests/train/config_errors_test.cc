// A config's mistakes against the list written by hand: one read names every mistaken key (its
// value, its name, a refused "auto"), in the order the sections are read, and a check across keys
// is left out once a named mistake may have caused it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config_section.h"
#include "core/error.h"
#include "train/config/train_config.h"

namespace zeroth {
namespace {

using json = nlohmann::json;

json base() {
  return json::parse(R"({"train_micro_batch_size_per_gpu": 2, "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 8}})");
}

// The message's lines, without the source locations users do not see.
std::vector<std::string> lines_of(const json& j) {
  try {
    TrainConfig::from_json(j);
  } catch (const ConfigError& e) {
    std::vector<std::string> out;
    const std::string m = detail::without_locations(e.what());
    for (size_t at = 0; at <= m.size();) {
      const size_t end = std::min(m.find('\n', at), m.size());
      out.push_back(m.substr(at, end - at));
      at = end + 1;
    }
    return out;
  }
  return {"(no error)"};
}

TEST(ConfigErrors, EveryMistakenKeyIsNamedInOneError) {
  json j = base();
  j["zero_optimization"] = json::parse(R"({"stage": 4, "offload_optimizer": {"device": "tape"}, "overlap_com": true})");
  j["run"] = json::parse(R"({"steps": "ten"})");
  j["bf16"] = json::parse(R"({"enabled": "yes"})");
  const std::vector<std::string> expected = {
      "5 mistakes in the config:",
      "  - run.steps must be an integer in [1, 1099511627776], got \"ten\"",
      "  - bf16.enabled must be true or false, got \"yes\"",
      "  - zero_optimization.overlap_com is not a known key (did you mean 'overlap_comm'?)",
      "  - zero_optimization.stage must be 0, 1, 2 or 3, got 4",
      "  - zero_optimization.offload_optimizer.device must be \"none\", \"cpu\" or \"nvme\", got \"tape\"",
  };
  EXPECT_EQ(lines_of(j), expected);
}

// One mistake reads as it always did: no count, no list.
TEST(ConfigErrors, OneMistakeIsItsOwnMessage) {
  json j = base();
  j["zero_optimization"] = json::parse(R"({"stage": 4})");
  EXPECT_EQ(lines_of(j), std::vector<std::string>{"zero_optimization.stage must be 0, 1, 2 or 3, got 4"});
}

// Stage 4 is named; the default stage 0 stands in for it, and offload_optimizer's need of stage 1
// or more would follow from the stand-in, not from the config: it is not named. Given alone, that
// rule still holds.
TEST(ConfigErrors, ARuleBrokenByAStandInIsNotNamed) {
  json j = base();
  j["zero_optimization"] = json::parse(R"({"stage": 4, "offload_optimizer": {"device": "cpu"}})");
  EXPECT_EQ(lines_of(j), std::vector<std::string>{"zero_optimization.stage must be 0, 1, 2 or 3, got 4"});
  j["zero_optimization"]["stage"] = 0;
  const auto alone = lines_of(j);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_NE(alone[0].find("zero_optimization.offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3"),
            std::string::npos)
      << alone[0];
}

// Outside a config read, a section's mistake is raised at once, as before.
TEST(ConfigErrors, ASectionReadAloneRaisesItsFirstMistake) {
  static constexpr std::string_view kKeys[] = {"a", "b"};
  const json j = json::parse(R"({"a": "x", "b": "y"})");
  const ConfigSection s(j, "s", kKeys);
  EXPECT_THROW(s.integer("a", 0, 0, 1), ConfigError);
}

}  // namespace
}  // namespace zeroth
