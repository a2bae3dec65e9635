// DeepSpeed's config vocabulary beyond what zeroth implements, in one table: keys that have no
// effect because zeroth always does what they ask, DeepSpeed features zeroth does not have, and
// keys that offload and checkpoints will give meaning. A key in none of these and in no parser is
// a typo ("not a known key", with a suggestion); a key here is never silently ignored.
#pragma once

#include <cstdint>      // uint8_t
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace zeroth {

enum class KeyTreatment : uint8_t {
  no_effect,    // accepted: zeroth's design always does what the key asks (or it only concerns
                // something zeroth does not have); named once at start
  unsupported,  // a DeepSpeed feature zeroth does not have: an error unless the value asks for nothing
  later,        // meaningful once offload / checkpoints exist: an error until then unless inert
};

struct DeepSpeedKey {
  std::string_view path;  // "memory_breakdown", "zero_optimization.contiguous_gradients"
  KeyTreatment treatment;
  // What DeepSpeed does with it (unsupported, later), or why it changes nothing here (no_effect).
  std::string_view text;
  // unsupported / later: the values that ask for nothing (DeepSpeed's off value); nullptr: none.
  bool (*inert)(const nlohmann::json&) = nullptr;
};

std::span<const DeepSpeedKey> deepspeed_keys();

// Handles `section.key` (section "" for the top level) when the table has it: a key error
// (ZEROTH_KEY_ERROR: raised, or recorded under a ConfigErrors) for an unsupported or later key
// with a value that asks for something, records a no-effect key
// in `no_effect` ("path: why"). Returns false when the table does not have the key.
bool handle_deepspeed_key(std::string_view section, const std::string& key, const nlohmann::json& value,
                          std::vector<std::string>* no_effect);
// What a section does with a key that is neither its own nor in the table.
enum class UnknownKeys : uint8_t {
  refuse,              // "not a known key", with a suggestion
  ignore_unless_typo,  // for what DeepSpeed reads by hand and so ignores (the top level, bf16): refused
                       // when it is within a typo of a known key, else named once as ignored
};
// What an "auto" value left after the trainer's resolution means in a section.
enum class AutoValues : uint8_t {
  refuse,        // the section's parser refuses it: zeroth had to resolve it and could not
  mean_default,  // DeepSpeed's default, as its config models drop "auto" (zero_optimization, its
                 // offload sections, fp16, bf16); only for the section's own keys and the table's:
                 // "auto" on any other key is as unknown as any other value, so a typo never passes
};
// `section` without the keys the table handles (handle_deepspeed_key: a key error for those asking
// for what zeroth lacks, and those with no effect recorded), so the section's own parser sees only
// the keys in `own`. A key in neither is treated as `unknown` says. `path` is the section's
// ("" for the top level).
nlohmann::json without_deepspeed_extras(const nlohmann::json& section, std::string_view path, std::span<const std::string_view> own,
                                        std::vector<std::string>& no_effect, UnknownKeys unknown = UnknownKeys::refuse,
                                        AutoValues autos = AutoValues::refuse);
// The table's key names directly under `section`, for "did you mean" suggestions.
std::vector<std::string_view> deepspeed_key_names(std::string_view section);

}  // namespace zeroth
