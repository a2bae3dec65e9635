// ZeroConfig against DeepSpeed's zero_optimization section: its keys, defaults and old names, and
// the errors for what it cannot mean.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/config/config.h"

namespace zeroth {
namespace {

TEST(ZeroConfig, ReadsDeepSpeedKeysAndRejectsUnknownAndUnsupportedOnes) {
  const auto z = ZeroConfig::from_deepspeed(nlohmann::json::parse(
      R"({"stage": 3, "reduce_bucket_size": 5e5, "stage3_prefetch_bucket_size": 4.5e5, "offload_optimizer": {"device": "none"}})"));
  EXPECT_EQ(z.stage, 3);
  EXPECT_EQ(z.reduce_bucket_size, 500000u);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 450000u);
  EXPECT_TRUE(z.overlap_comm);                                                                      // DeepSpeed's default for stage 3
  EXPECT_FALSE(ZeroConfig::from_deepspeed(nlohmann::json::parse(R"({"stage": 2})")).overlap_comm);  // and for the others
  EXPECT_FALSE(ZeroConfig::from_deepspeed(nlohmann::json::parse(R"({"stage": 3, "overlap_comm": false})")).overlap_comm);
  auto message = [](const char* text) {
    try {
      ZeroConfig::from_deepspeed(nlohmann::json::parse(text));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(R"({"stage": 2, "reduce_bucket_sise": 1})").find("did you mean 'reduce_bucket_size'"), std::string::npos);
  EXPECT_NE(message(R"({"stage": 4})").find("0, 1, 2 or 3"), std::string::npos);
  EXPECT_NE(message(R"({"stage": 2, "zero_quantized_weights": true})").find("does not support"), std::string::npos);
  // "auto" left unresolved is DeepSpeed's default, as its config models drop it; on a key neither
  // zeroth nor DeepSpeed has it is as unknown as any value, so a typo never passes.
  EXPECT_EQ(message(R"({"stage": 2, "reduce_bucket_size": "auto", "contiguous_gradients": "auto"})"), "accepted");
  EXPECT_EQ(ZeroConfig::from_deepspeed(nlohmann::json::parse(R"({"stage": 2, "reduce_bucket_size": "auto"})")).reduce_bucket_size,
            ZeroConfig{}.reduce_bucket_size);
  EXPECT_NE(message(R"({"stage": 2, "reduce_bucket_sise": "auto"})").find("did you mean 'reduce_bucket_size'"), std::string::npos);
  EXPECT_NE(message(
                R"({"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": "auto"}, "offload_optimizer": {"device": "cpu"}})")
                .find("zero_optimization.offload_param.pin_memroy is not a known key (did you mean 'pin_memory'?)"),
            std::string::npos);
  // DeepSpeed ignores offload_param below stage 3 (DeepSpeed-Chat sets it at stage 0): accepted,
  // said once, and nothing offloaded; a config built in code that asks for it is still refused.
  for (int stage : {0, 2}) {
    const auto z = ZeroConfig::from_deepspeed(
        nlohmann::json::parse(fmt::format(R"({{"stage": {}, "offload_param": {{"device": "cpu"}}}})", stage)));
    EXPECT_FALSE(z.offload_param.enabled()) << stage;
    const bool noted = std::any_of(z.no_effect.begin(), z.no_effect.end(), [](const std::string& n) {
      return n.find("zero_optimization.offload_param.device = \"cpu\": DeepSpeed offloads parameters at stage 3 only") !=
             std::string::npos;
    });
    EXPECT_TRUE(noted) << stage;
    ZeroConfig direct = z;
    direct.stage = 2;  // at stage 0 the optimizer's offload is refused first
    direct.offload_optimizer.device = OffloadDevice::cpu;
    direct.offload_param.device = OffloadDevice::cpu;
    std::string refused = "accepted";
    try {
      direct.validate();
    } catch (const ConfigError& e) {
      refused = e.what();
    }
    EXPECT_NE(refused.find("needs zero_optimization.stage 3"), std::string::npos) << stage << ": " << refused;
  }
  EXPECT_NE(message(R"({"stage": 2, "offload_optimizer": {"device": "disk"}})").find("\"none\", \"cpu\" or \"nvme\""),
            std::string::npos);
  EXPECT_NE(message(R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}})").find("fraction in [0, 1]"),
            std::string::npos);
  // The delayed update (zeroth's keys): the host's, for the whole shard.
  const auto delayed = ZeroConfig::from_deepspeed(nlohmann::json::parse(
      R"({"stage": 3, "offload_optimizer": {"device": "cpu", "delayed_update": true, "delayed_update_warmup": 3}})"));
  EXPECT_TRUE(delayed.offload_optimizer.delayed_update);
  EXPECT_EQ(delayed.offload_optimizer.delayed_update_warmup, 3u);
  EXPECT_FALSE(ZeroConfig::from_deepspeed(nlohmann::json::parse(R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})"))
                   .offload_optimizer.delayed_update);
  EXPECT_NE(message(R"({"stage": 2, "offload_optimizer": {"device": "none", "delayed_update": true}})")
                .find("delayed_update needs offload_optimizer.device \"cpu\" or \"nvme\""),
            std::string::npos);
  EXPECT_NE(message(R"({"stage": 3, "offload_optimizer": {"device": "cpu", "delayed_update": true, "ratio": 0.5}})")
                .find("set ratio to 1 or turn delayed_update off"),
            std::string::npos);
  EXPECT_NE(message(R"({"stage": 3, "offload_optimizer": {"device": "cpu", "delayed_update": true, "delayed_update_warmup": -1}})")
                .find("delayed_update_warmup"),
            std::string::npos);
  // DeepSpeed applies offload_optimizer.ratio at stage 3 only: below, the whole shard goes, said at start.
  for (int stage : {1, 2, 3}) {
    const auto z = ZeroConfig::from_deepspeed(
        nlohmann::json::parse(fmt::format(R"({{"stage": {}, "offload_optimizer": {{"device": "cpu", "ratio": 0.25}}}})", stage)));
    EXPECT_EQ(z.offload_optimizer.ratio, stage == 3 ? 0.25 : 1.0) << stage;
    const bool noted = std::any_of(z.no_effect.begin(), z.no_effect.end(),
                                   [](const std::string& n) { return n.find("applies it at stage 3 only") != std::string::npos; });
    EXPECT_EQ(noted, stage < 3) << stage;
  }
  // DeepSpeed's old names, and its new section winning over them.
  const auto legacy = ZeroConfig::from_deepspeed(
      nlohmann::json::parse(R"({"stage": 2, "cpu_offload": true, "cpu_offload_use_pin_memory": true})"));
  EXPECT_EQ(legacy.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_TRUE(legacy.offload_optimizer.pin_memory);
  EXPECT_NE(message(R"({"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})")
                .find("DeepSpeed refuses the pair too: keep offload_optimizer"),
            std::string::npos);
  const auto nvme = ZeroConfig::from_deepspeed(
      nlohmann::json::parse(R"({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})"));
  EXPECT_EQ(nvme.offload_optimizer.device, OffloadDevice::nvme);
  EXPECT_EQ(nvme.offload_optimizer.nvme_path, "/x");
  EXPECT_EQ(nvme.offload_optimizer.buffer_count, 4u);  // DeepSpeed's default
  EXPECT_EQ(nvme.offload_param.buffer_count, 5u);
  EXPECT_NE(message(R"({"stage": 2, "sub_group_size": 0})").find("sub_group_size"), std::string::npos);
  EXPECT_NE(message(R"({"stage": 3, "overlap_comm": 1})").find("zero_optimization.overlap_comm must be true or false"),
            std::string::npos);
  EXPECT_EQ(ZeroConfig::from_deepspeed(nlohmann::json::parse(R"({"sub_group_size": 1e6})")).sub_group_size, 1'000'000u);
}

}  // namespace
}  // namespace zeroth
