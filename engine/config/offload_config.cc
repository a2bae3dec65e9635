// Parsing of DeepSpeed's offload sections (zero_optimization.offload_optimizer, .offload_param,
// the legacy cpu_offload keys) and of the top-level `aio` section, in DeepSpeed's names and
// meanings (deepspeed/runtime/zero/offload_config.py, swap_tensor/aio_config.py).
#include <algorithm>    // std::find
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"                    // ZEROTH_THROW
#include "core/config_section.h"           // ConfigSection
#include "engine/config/config.h"          // OffloadConfig, AioConfig
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras

namespace zeroth {
namespace {

using json = nlohmann::json;

// DeepSpeed's counts of buffers and bytes: whole numbers from 1.
uint64_t positive(const ConfigSection& s, const char* key, uint64_t def) {
  return static_cast<uint64_t>(
      s.integer(key, static_cast<int64_t>(def), 1, int64_t{1'000'000'000'000'000'000}, "a positive whole number"));
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
  static constexpr std::string_view kOptimizerKeys[] = {"device",           "nvme_path",      "buffer_count",
                                                        "pin_memory",       "pipeline_read",  "pipeline_write",
                                                        "pipeline",         "fast_init",      "ratio",
                                                        "overlap_backward", "delayed_update", "delayed_update_warmup"};
  static constexpr std::string_view kParamKeys[] = {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"};
  const std::span<const std::string_view> known = params ? std::span<const std::string_view>(kParamKeys) : kOptimizerKeys;
  const json own = without_deepspeed_extras(section, path, known, o.no_effect, UnknownKeys::refuse, AutoValues::mean_default);
  const ConfigSection s(own, path, known);
  if (s.has("device")) {
    static constexpr std::string_view kDevices[] = {"none", "cpu", "nvme"};
    const json& v = s.raw("device");
    const std::string d = v.is_string() ? v.get<std::string>() : "";
    if (std::find(std::begin(kDevices), std::end(kDevices), d) == std::end(kDevices))
      ZEROTH_KEY_ERROR("{} must be \"none\", \"cpu\" or \"nvme\", got {}", s.at("device"), v.dump());
    o.device = d == "cpu" ? OffloadDevice::cpu : d == "nvme" ? OffloadDevice::nvme : OffloadDevice::none;
  }
  if (s.has("nvme_path")) {
    const json& v = s.raw("nvme_path");
    if (!v.is_string() || v.get<std::string>().empty())
      ZEROTH_KEY_ERROR("{} must be a folder on the NVMe drive, got {}", s.at("nvme_path"), v.dump());
    else o.nvme_path = v.get<std::string>();
  }
  o.pin_memory = s.flag("pin_memory", o.pin_memory);
  o.pipeline_read = s.flag("pipeline_read", o.pipeline_read);
  o.pipeline_write = s.flag("pipeline_write", o.pipeline_write);
  o.overlap_backward = s.flag("overlap_backward", o.overlap_backward);
  o.delayed_update = s.flag("delayed_update", o.delayed_update);
  o.delayed_update_warmup = static_cast<uint64_t>(s.integer("delayed_update_warmup", static_cast<int64_t>(o.delayed_update_warmup), 0,
                                                            int64_t{1} << 40, "a number of steps, 0 or more"));
  // DeepSpeed derives `pipeline` from the two above; fast_init skips its first swap-out, which
  // zeroth never does (the swap files start as zeroed extents).
  for (const char* key : {"fast_init", "pipeline"}) {
    if (!s.has(key)) continue;
    s.flag(key, false);
    o.no_effect.push_back(s.at(key) + (std::string_view(key) == "pipeline"
                                           ? ": DeepSpeed computes it from pipeline_read and pipeline_write"
                                           : ": zeroth's swap files start zeroed, so initialization never swaps"));
  }
  o.ratio = s.number("ratio", o.ratio, 0, 1, "a fraction in [0, 1]");
  for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu"}) {
    if (!s.has(key)) continue;
    const std::string_view k = key;
    uint64_t& field = k == "buffer_count" ? o.buffer_count : k == "buffer_size" ? o.buffer_size : o.max_in_cpu;
    field = positive(s, key, field);
    o.no_effect.push_back(s.at(key) +
                          ": zeroth sizes its swap buffers from the plan (sub_group_size, the reduce buckets, pipeline_read/write)");
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
  const ConfigSection s(section, "aio", kKeys);
  a.block_size = positive(s, "block_size", a.block_size);
  if (a.block_size % 4096 != 0 || a.block_size > (uint64_t{1} << 30))
    ZEROTH_THROW(ConfigError, "aio.block_size must be a multiple of 4096 bytes (O_DIRECT) and at most 1 GiB, got {}",
                 s.raw("block_size").dump());
  a.queue_depth = positive(s, "queue_depth", a.queue_depth);
  if (a.queue_depth > 4096) ZEROTH_THROW(ConfigError, "aio.queue_depth must be at most 4096, got {}", s.raw("queue_depth").dump());
  for (const char* key : {"intra_op_parallelism", "thread_count"}) {
    if (!s.has(key)) continue;
    a.threads = positive(s, key, a.threads);
    if (a.threads > 64) ZEROTH_THROW(ConfigError, "{} must be at most 64, got {}", s.at(key), s.raw(key).dump());
  }
  a.single_submit = s.flag("single_submit", a.single_submit);
  if (a.single_submit) a.no_effect.push_back("aio.single_submit: zeroth submits the pieces of a request in batches either way");
  a.overlap_events = s.flag("overlap_events", a.overlap_events);
  if (!a.overlap_events) a.no_effect.push_back("aio.overlap_events: zeroth always reaps completions while other pieces are in flight");
  if (s.flag("use_gds", false))
    ZEROTH_THROW(ConfigError, "aio.use_gds = true asks for GPUDirect Storage, a DeepSpeed feature zeroth does not support; remove it");
  return a;
}

}  // namespace zeroth
