// A tokenizer's chat template: tokenizer_config.json's `chat_template` (or a template file that
// overrides it) with its special tokens, rendered over a conversation as Hugging Face's
// apply_chat_template renders it.
#pragma once

#include <cstddef>  // size_t
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "train/text/jinja/template.h"

namespace zeroth {

class ChatTemplate {
 public:
  // From `folder`/tokenizer_config.json: its special tokens, and the template of `template_file`
  // when given, else of chat_template.jinja beside the config when there is one (newer folders),
  // else the config's chat_template (a string, or the "default" of a list of named ones).
  static ChatTemplate from_folder(const std::string& folder, const std::string& template_file = "");
  // A tokenizer folder's special tokens (tokenizer_config.json's; none without one), and whether
  // it has a chat template (chat_template.jinja, or the config's chat_template).
  static nlohmann::ordered_json special_tokens_of(const std::string& folder);
  static bool folder_has_template(const std::string& folder);
  // A template file alone (no tokenizer folder: text as bytes): no special tokens.
  static ChatTemplate from_file(const std::string& template_file);
  // `special_tokens`: bos_token, eos_token and the others tokenizer_config.json names, as strings.
  ChatTemplate(const std::string& source, std::string where, nlohmann::ordered_json special_tokens);

  // `messages`: a list of {"role", "content", ...}; `tools`: null when none are given (the
  // template sees None, as Hugging Face passes it).
  jinja::Rendered render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                         const nlohmann::ordered_json& tools = nullptr) const;
  // A conversation rendered for training, and the byte ranges of it the loss counts: what each
  // assistant turn adds, its end-of-turn tokens included. Where the template marks them with
  // {% generation %}, the marks; otherwise, as TRL does, each assistant turn's part is what
  // rendering the conversation up to it adds to rendering the turns before it with the generation
  // prompt. A template whose renderings are not prefixes of one another (one that rewrites earlier
  // turns, as Qwen3's drops their reasoning) is refused there: it needs the marks.
  struct Trained {
    std::string text;
    std::vector<std::pair<size_t, size_t>> spans;
  };
  Trained render_assistant_spans(const nlohmann::ordered_json& messages) const;
  const std::string& where() const { return template_.where(); }
  // What the template writes after an assistant's turn, up to the first whitespace (ChatML's
  // <|im_end|>, Llama 3's <|eot_id|>), or else the eos_token: where a chat reply ends.
  std::string end_of_turn() const;
  // The special token of that name ("eos_token"), or empty.
  std::string special_token(const std::string& name) const;

 private:
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace zeroth
