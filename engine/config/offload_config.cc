// Parsing of DeepSpeed's offload sections (zero_optimization.offload_optimizer, .offload_param,
// the legacy cpu_offload keys) and of the top-level `aio` section, in DeepSpeed's names and
// meanings (deepspeed/runtime/zero/offload_config.py, swap_tensor/aio_config.py).
#include <algorithm>    // std::find
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"            // ZEROTH_THROW
#include "core/strings.h"          // did_you_mean
#include "engine/config/config.h"  // OffloadConfig, AioConfig

namespace zeroth {
namespace {

using json = nlohmann::json;

bool boolean(const json& v, const std::string& path) {
  if (!v.is_boolean()) ZEROTH_THROW(ConfigError, "{} must be true or false, got {}", path, v.dump());
  return v.get<bool>();
}

uint64_t positive(const json& v, const std::string& path) {
  if (!v.is_number() || v.get<double>() < 1 || v.get<double>() > 1e18 ||
      v.get<double>() != static_cast<double>(static_cast<uint64_t>(v.get<double>()))) {
    ZEROTH_THROW(ConfigError, "{} must be a positive whole number, got {}", path, v.dump());
  }
  return static_cast<uint64_t>(v.get<double>());
}

void unknown(const std::string& path, const std::string& key, std::span<const std::string_view> known) {
  ZEROTH_THROW(ConfigError, "{}.{} is not a known key{}", path, key,
               did_you_mean(key, std::vector<std::string_view>(known.begin(), known.end())));
}

}  // namespace

std::string_view offload_device_name(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
  }
  return "?";
}

OffloadConfig OffloadConfig::from_deepspeed(const json& section, std::string_view where, bool params) {
  const std::string path(where);
  OffloadConfig o = defaults(params);
  if (section.is_null()) return o;
  if (!section.is_object())
    ZEROTH_THROW(ConfigError, "{} must be an object like {{\"device\": \"cpu\"}}, got {}", path, section.dump());
  static constexpr std::string_view kOptimizerKeys[] = {"device",         "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                                                        "pipeline_write", "pipeline",  "fast_init",    "ratio"};
  static constexpr std::string_view kParamKeys[] = {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"};
  const std::span<const std::string_view> known = params ? std::span<const std::string_view>(kParamKeys) : kOptimizerKeys;
  for (const auto& [key, v] : section.items()) {
    const std::string at = path + "." + key;
    if (std::find(known.begin(), known.end(), key) == known.end()) unknown(path, key, known);
    if (key == "device") {
      const std::string d = v.is_string() ? v.get<std::string>() : "";
      if (d == "none") o.device = OffloadDevice::none;
      else if (d == "cpu") o.device = OffloadDevice::cpu;
      else if (d == "nvme") o.device = OffloadDevice::nvme;
      else ZEROTH_THROW(ConfigError, "{} must be \"none\", \"cpu\" or \"nvme\", got {}", at, v.dump());
    } else if (key == "nvme_path") {
      if (!v.is_null() && (!v.is_string() || v.get<std::string>().empty()))
        ZEROTH_THROW(ConfigError, "{} must be a folder on the NVMe drive, got {}", at, v.dump());
      o.nvme_path = v.is_null() ? "" : v.get<std::string>();
    } else if (key == "pin_memory") {
      o.pin_memory = boolean(v, at);
    } else if (key == "pipeline_read") {
      o.pipeline_read = boolean(v, at);
    } else if (key == "pipeline_write") {
      o.pipeline_write = boolean(v, at);
    } else if (key == "pipeline" || key == "fast_init") {
      // DeepSpeed derives `pipeline` from the two above; fast_init skips its first swap-out,
      // which zeroth never does (the swap files start as zeroed extents).
      boolean(v, at);
      o.no_effect.push_back(at + (key == "pipeline" ? ": DeepSpeed computes it from pipeline_read and pipeline_write"
                                                    : ": zeroth's swap files start zeroed, so initialization never swaps"));
    } else if (key == "ratio") {
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
        ZEROTH_THROW(ConfigError, "{} must be a fraction in [0, 1], got {}", at, v.dump());
      o.ratio = v.get<double>();
    } else if (key == "buffer_count" || key == "buffer_size" || key == "max_in_cpu") {
      (key == "buffer_count" ? o.buffer_count : key == "buffer_size" ? o.buffer_size : o.max_in_cpu) = positive(v, at);
      o.no_effect.push_back(at +
                            ": zeroth sizes its swap buffers from the plan (sub_group_size, the reduce buckets, pipeline_read/write)");
    }
  }
  if (o.device == OffloadDevice::nvme && o.nvme_path.empty())
    ZEROTH_THROW(ConfigError, "{}.device is \"nvme\" but {}.nvme_path is not set: name a folder on the drive for the swap files", path,
                 path);
  return o;
}

AioConfig AioConfig::from_deepspeed(const json& section) {
  AioConfig a;
  if (section.is_null()) return a;
  if (!section.is_object())
    ZEROTH_THROW(ConfigError, "aio must be an object like {{\"block_size\": 1048576}}, got {}", section.dump());
  static constexpr std::string_view kKeys[] = {"block_size",   "queue_depth",   "intra_op_parallelism",
                                               "thread_count", "single_submit", "overlap_events",
                                               "use_gds"};
  for (const auto& [key, v] : section.items()) {
    const std::string at = "aio." + key;
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) unknown("aio", key, kKeys);
    if (key == "block_size") {
      a.block_size = positive(v, at);
      if (a.block_size % 4096 != 0 || a.block_size > (uint64_t{1} << 30))
        ZEROTH_THROW(ConfigError, "aio.block_size must be a multiple of 4096 bytes (O_DIRECT) and at most 1 GiB, got {}", v.dump());
    } else if (key == "queue_depth") {
      a.queue_depth = positive(v, at);
      if (a.queue_depth > 4096) ZEROTH_THROW(ConfigError, "aio.queue_depth must be at most 4096, got {}", v.dump());
    } else if (key == "intra_op_parallelism" || key == "thread_count") {
      a.threads = positive(v, at);
      if (a.threads > 64) ZEROTH_THROW(ConfigError, "{} must be at most 64, got {}", at, v.dump());
    } else if (key == "single_submit") {
      a.single_submit = boolean(v, at);
      if (a.single_submit) a.no_effect.push_back(at + ": zeroth submits the pieces of a request in batches either way");
    } else if (key == "overlap_events") {
      a.overlap_events = boolean(v, at);
      if (!a.overlap_events) a.no_effect.push_back(at + ": zeroth always reaps completions while other pieces are in flight");
    } else if (key == "use_gds") {
      if (boolean(v, at))
        ZEROTH_THROW(ConfigError,
                     "aio.use_gds = true asks for GPUDirect Storage, a DeepSpeed feature zeroth does not support; remove it");
    }
  }
  return a;
}

}  // namespace zeroth
