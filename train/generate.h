// `zeroth generate` and a run's closing sample: text from the weights a config starts from, one
// rank holding the whole model, decoded with the model's key/value cache (Gpt::decode).
#pragma once

#include <cstdint>      // int32_t, uint64_t
#include <functional>   // std::function
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "train/config/train_config.h"  // TrainConfig

namespace zeroth {

struct GenerateOptions {
  std::string prompt;  // "": start from a newline, the token between the fortunes' lines
  // The prompt as a user's message through the chat template (chat_template_of), with the
  // generation prompt, `system` first when given; generation stops at the template's end of turn
  // (ChatTemplate::end_of_turn), which the text leaves out.
  bool chat = false;
  std::string system;
  int max_new_tokens = 128;
  // 0: greedy (the most likely token; the lowest id among equals). Otherwise the logits divided by
  // it, cut to the top_k most likely (0: all) and then to the smallest set holding top_p of the
  // probability, sampled with a generator seeded by `seed`.
  double temperature = 1.0;
  int top_k = 50;
  double top_p = 1.0;
  uint64_t seed = 1234;
};

struct GenerateResult {
  std::string rendered;                  // the text the prompt's tokens are (with --chat: the template's)
  bool ended = false;                    // chat: the reply reached its end of turn
  std::vector<int32_t> prompt_ids, ids;  // the prompt's tokens, the new ones
  std::string text;                      // the new tokens' text
  int max_new_tokens = 0;                // what model.seq_len left of the request
  double seconds = 0;                    // the new tokens' decoding (the prompt's pass included)
};

// The next token from `logits` (its first `vocab` entries) by `o`'s rule; `draw` is uniform in [0, 1).
int32_t sample_token(const std::vector<float>& logits, int vocab, const GenerateOptions& o, double draw);

// The text of the config's weights (run.init_from, run.resume's checkpoint, or else a fresh
// initialization) after o.prompt, on one rank (whatever run.world_size and parallel.* say), the
// tokens through data.tokenizer (or bytes for text data). `on_text` gets each new piece of text as
// soon as it is whole (UTF-8 characters are not cut).
GenerateResult generate(const TrainConfig& config, const GenerateOptions& o,
                        const std::function<void(std::string_view)>& on_text = {});

}  // namespace zeroth
