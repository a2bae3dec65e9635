// Errors carry the failing call, its location and errno text; logging levels parse.
#include <gtest/gtest.h>
#include <fcntl.h>

#include <set>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {
namespace {

TEST(Errors, CheckNamesConditionMessageAndLocation) {
  try {
    const int world = 3;
    ZEROTH_CHECK(world % 2 == 0, "world size {} must be even", world);
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("world size 3 must be even"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world % 2 == 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tests/core/error_test.cc:"), std::string::npos) << msg;
  }
}

TEST(Errors, SyscallCheckReportsTheCallAndErrno) {
  try {
    SYSCALL_CHECK(::open("/nonexistent/zeroth/file", O_RDONLY));
    FAIL();
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("::open(\"/nonexistent/zeroth/file\", O_RDONLY) failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory (errno 2)"), std::string::npos) << msg;
  }
}

TEST(Errors, TypedErrorsShareOneBase) {
  EXPECT_THROW(throw OutOfMemory("x"), Error);
  EXPECT_THROW(throw CudaError("x"), Error);
  EXPECT_THROW(throw ConfigError("x"), Error);
}

// What a user is shown: the message without the locations ZEROTH_THROW appends, nested ones too;
// brackets that are not a source location stay, and so does a failed check's (a bug's) location.
TEST(Errors, UsersSeeMessagesWithoutSourceLocations) {
  try {
    ZEROTH_THROW(ConfigError, "run.steps must be positive");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(" [tests/core/error_test.cc:"), std::string::npos) << e.what();
    EXPECT_EQ(detail::without_locations(e.what()), "run.steps must be positive");
  }
  EXPECT_EQ(detail::without_locations("rank 1: open(\"x\"): No such file [offload/aio.cc:12] [tools/launch/launcher.cc:144]"),
            "rank 1: open(\"x\"): No such file");
  EXPECT_EQ(detail::without_locations("betas [0.9, 0.95] and [a.txt:3] kept"), "betas [0.9, 0.95] and [a.txt:3] kept");
  EXPECT_EQ(detail::without_locations("bad [check `n > 0` at core/x.cc:7]"), "bad [check `n > 0` at core/x.cc:7]");
}

TEST(Logging, LevelsParseAndUnknownOnesAreRejected) {
  EXPECT_EQ(log::parse_level("warn"), log::Level::warn);
  EXPECT_EQ(log::parse_level("off"), log::Level::off);
  EXPECT_THROW(log::parse_level("verbose"), ConfigError);
  const auto saved = log::level();
  log::set_level(log::Level::error);
  EXPECT_EQ(log::level(), log::Level::error);
  log::set_level(saved);
}

TEST(Logging, LinesCarryTheRankAndRespectTheLevel) {
  const auto saved = log::level();
  log::set_level(log::Level::info);
  log::set_thread_rank(3);
  ::testing::internal::CaptureStderr();
  ZLOG_INFO("step {} done", 7);
  ZLOG_DEBUG("not shown");
  const std::string text = ::testing::internal::GetCapturedStderr();
  log::set_thread_rank(-1);
  log::set_level(saved);
  EXPECT_NE(text.find("[rank 3] info: step 7 done"), std::string::npos) << text;
  EXPECT_EQ(text.find("not shown"), std::string::npos) << text;
}

TEST(Environment, EveryVariableIsDeclaredOnceWithItsMeaning) {
  std::set<std::string_view> names;
  for (const auto& v : env::all()) {
    EXPECT_TRUE(v.name.starts_with("ZEROTH_")) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    EXPECT_TRUE(names.insert(v.name).second) << "declared twice: " << v.name;
  }
  setenv("ZEROTH_TEST_INT", "12x", 1);
  EXPECT_THROW(env::get_int("ZEROTH_TEST_INT"), ConfigError);
  setenv("ZEROTH_TEST_INT", "-12", 1);
  EXPECT_EQ(env::get_int("ZEROTH_TEST_INT"), -12);
}

}  // namespace
}  // namespace zeroth
