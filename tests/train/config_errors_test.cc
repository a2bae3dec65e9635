// A config's mistakes against the lists written by hand: one read names every mistaken key (its
// value, its name, a refused "auto"), in the order the sections are read; a check that raises ends
// the read, and is left out once a named mistake may have caused it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config_section.h"
#include "core/error.h"
#include "tests/train/config_fixture.h"
#include "train/config/train_config.h"

namespace zeroth {
namespace {

using namespace config_fixture;

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

// The mistakes ConfigSection itself finds (a key its section does not have, a refused "auto") are
// named with the others, and the refused key's default stands in.
TEST(ConfigErrors, UnknownKeysAndRefusedAutosOfASectionAreNamedToo) {
  json j = base();
  j["model"]["n_layr"] = 2;
  j["run"] = json::parse(R"({"seed": "auto", "steps": 0})");
  const std::vector<std::string> expected = {
      "3 mistakes in the config:",
      "  - run.seed is \"auto\", which zeroth cannot resolve for this key; give a value",
      "  - run.steps must be an integer in [1, 1099511627776], got 0",
      "  - model.n_layr is not a known key (did you mean 'n_layer'?)",
  };
  EXPECT_EQ(lines_of(j), expected);
}

// A section that raises may leave its part half made (parallel's pipeline stages before their
// check against the world): the read ends there rather than dividing the batch by what it left.
TEST(ConfigErrors, ASectionThatRaisesEndsTheRead) {
  json j = base();
  j["train_batch_size"] = 4;
  j["pipeline"] = json::parse(R"({"stages": 2})");
  const auto lines = lines_of(j);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("run.world_size = 1 is not a multiple of the 2 pipeline stages"), std::string::npos) << lines[0];
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

// Outside a config read, a section's first mistake is raised at once, as before, by its reader
// and by its constructor; a ConfigErrors records only while in scope, and raises what it holds.
TEST(ConfigErrors, OutsideAReadMistakesAreRaisedAtOnce) {
  static constexpr std::string_view kKeys[] = {"a", "b"};
  const json j = json::parse(R"({"a": "x", "b": "y"})");
  const ConfigSection s(j, "s", kKeys);
  try {
    s.integer("a", 0, 0, 1);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(detail::without_locations(e.what()), "s.a must be an integer in [0, 1], got \"x\"");
  }
  EXPECT_THROW(ConfigSection(json{{"c", 1}}, "s", kKeys), ConfigError);
  EXPECT_THROW(ConfigSection(json{{"a", "auto"}}, "s", kKeys), ConfigError);
  {
    ConfigErrors errors;
    EXPECT_EQ(s.integer("a", 7, 0, 1), 7);  // recorded; the default stands in
    EXPECT_FALSE(s.flag("b", false));
    try {
      errors.raise();
      ADD_FAILURE() << "nothing raised";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("2 mistakes in the config:"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(s.integer("a", 0, 0, 1), ConfigError);  // out of its scope: raised again
}

// An error that is not a config's is raised when nothing was named before it, and dropped after a
// named mistake (a stand-in's neighbour read with the wrong type); either way the read ends.
TEST(ConfigErrors, OtherErrorsAreRaisedUnlessAMistakeCameFirst) {
  {
    ConfigErrors errors;
    EXPECT_THROW(errors.section([] { throw std::runtime_error("not a config's"); }), std::runtime_error);
  }
  ConfigErrors errors;
  errors.section([] { ConfigErrors::key("k is wrong"); });
  EXPECT_NO_THROW(errors.section([] { throw std::runtime_error("type error"); }));
  bool ran = false;
  errors.section([&] { ran = true; });
  EXPECT_FALSE(ran) << "a section ran after one raised";
  try {
    errors.raise();
    ADD_FAILURE() << "nothing raised";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "k is wrong");
  }
}

}  // namespace
}  // namespace zeroth
