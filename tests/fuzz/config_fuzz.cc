// The training config as `zeroth train` reads it: a file through read_config_file, then
// TrainConfig::from_json. A config or a zeroth::Error (ConfigError naming what is wrong) are
// the outcomes; anything else escaping, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>

#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "train/config/train_config.h"  // read_config_file, TrainConfig

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return zeroth::fuzz::on_file(data, size, [](const std::string& path) {
    const auto config = zeroth::TrainConfig::from_json(zeroth::read_config_file(path));
    (void)config.tokens_per_step();
  });
}
