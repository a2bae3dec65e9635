#include "train/text/chat_template.h"

#include <filesystem>  // std::filesystem::path
#include <fstream>     // std::ifstream
#include <sstream>     // std::stringstream

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ZEROTH_THROW(InvalidArgument, "{}: cannot read {}", path, what);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A special token as tokenizer_config.json writes it: a string, or an AddedToken's {"content"}.
std::string token_text(const nlohmann::ordered_json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

}  // namespace

namespace {

nlohmann::ordered_json folder_config(const std::string& folder) {
  const std::string config_path = (std::filesystem::path(folder) / "tokenizer_config.json").string();
  try {
    return nlohmann::ordered_json::parse(read_text(config_path, "the tokenizer's config (tokenizer_config.json)"));
  } catch (const nlohmann::json::exception& e) {
    ZEROTH_THROW(InvalidArgument, "{}: not valid JSON: {}", config_path, e.what());
  }
}

nlohmann::ordered_json special_of(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (config.contains(name)) {
      const std::string t = token_text(config[name]);
      if (!t.empty()) special[name] = t;
    }
  }
  return special;
}

}  // namespace

nlohmann::ordered_json ChatTemplate::special_tokens_of(const std::string& folder) {
  if (folder.empty() || !std::filesystem::exists(std::filesystem::path(folder) / "tokenizer_config.json"))
    return nlohmann::ordered_json::object();
  return special_of(folder_config(folder));
}

bool ChatTemplate::folder_has_template(const std::string& folder) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(fs::path(folder) / "chat_template.jinja")) return true;
  return fs::exists(fs::path(folder) / "tokenizer_config.json") && folder_config(folder).contains("chat_template");
}

ChatTemplate ChatTemplate::from_folder(const std::string& folder, const std::string& template_file) {
  const std::string config_path = (std::filesystem::path(folder) / "tokenizer_config.json").string();
  // Newer folders keep the template beside the config, and Hugging Face then takes it from there.
  const std::string beside = (std::filesystem::path(folder) / "chat_template.jinja").string();
  const nlohmann::ordered_json config = folder_config(folder);
  const nlohmann::ordered_json special = special_of(config);
  if (!template_file.empty())
    return ChatTemplate(read_text(template_file, "the chat template (data.chat_template)"), template_file, special);
  if (std::filesystem::is_regular_file(beside)) return ChatTemplate(read_text(beside, "the chat template"), beside, special);
  if (!config.contains("chat_template")) {
    ZEROTH_THROW(InvalidArgument,
                 "{} has no chat_template and there is no chat_template.jinja beside it: name a Jinja template file in "
                 "data.chat_template, or use a tokenizer folder that has one",
                 config_path);
  }
  const auto& t = config["chat_template"];
  const std::string where = config_path + "'s chat_template";
  if (t.is_string()) return ChatTemplate(t.get<std::string>(), where, special);
  if (t.is_array()) {
    for (const auto& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") && named["template"].is_string())
        return ChatTemplate(named["template"].get<std::string>(), where + " \"default\"", special);
    ZEROTH_THROW(InvalidArgument, "{} lists named templates but none named \"default\"", where);
  }
  ZEROTH_THROW(InvalidArgument, "{} must be a string or a list of {{\"name\", \"template\"}}, got {}", where, t.type_name());
}

ChatTemplate ChatTemplate::from_file(const std::string& template_file) {
  return ChatTemplate(read_text(template_file, "the chat template (data.chat_template)"), template_file,
                      nlohmann::ordered_json::object());
}

ChatTemplate::ChatTemplate(const std::string& source, std::string where, nlohmann::ordered_json special_tokens)
    : template_(source, std::move(where)), special_tokens_(std::move(special_tokens)) {}

jinja::Rendered ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools) const {
  // Hugging Face passes tools and documents always, None when there are none.
  nlohmann::ordered_json variables = {{"messages", messages},
                                      {"tools", tools},
                                      {"documents", nullptr},
                                      {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [k, v] : special_tokens_.items()) variables[k] = v;
  return template_.render(jinja::Value::from_json(variables));
}

ChatTemplate::Trained ChatTemplate::render_assistant_spans(const nlohmann::ordered_json& messages) const {
  jinja::Rendered whole = render(messages, false);
  if (!whole.generation.empty()) return {std::move(whole.text), std::move(whole.generation)};
  Trained out{std::move(whole.text), {}};
  nlohmann::ordered_json turns = nlohmann::ordered_json::array();
  size_t assistant_turns = 0;
  // The template may refuse a conversation's beginning it would take whole (one that starts with the
  // assistant, say): its error says which prefix it was.
  const auto render_prefix = [&](bool prompt, size_t through_message) {
    try {
      return render(turns, prompt).text;
    } catch (const InvalidArgument& e) {
      ZEROTH_THROW(InvalidArgument, "rendering the conversation's first {} message(s){} to find the assistant's turns: {}",
                   through_message, prompt ? " with the generation prompt" : "", e.what());
    }
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const bool assistant = messages[i].is_object() && messages[i].value("role", "") == "assistant";
    std::string before;
    if (assistant) before = render_prefix(true, i);
    turns.push_back(messages[i]);
    if (!assistant) continue;
    ++assistant_turns;
    const std::string through = render_prefix(false, i + 1);
    const auto not_a_prefix = [&](const std::string& a, const std::string& b) { return b.compare(0, a.size(), a) != 0; };
    if (not_a_prefix(before, through) || not_a_prefix(through, out.text)) {
      ZEROTH_THROW(InvalidArgument,
                   "{}: rendering the conversation up to assistant turn {} (message {}) is not a prefix of rendering it whole, so "
                   "the turn's tokens cannot be told apart; mark the assistant's part with {{% generation %}} ... {{% endgeneration "
                   "%}} in the template (data.chat_template), or train on the whole text (data.loss_on \"all\")",
                   where(), assistant_turns, i);
    }
    if (through.size() > before.size()) out.spans.emplace_back(before.size(), through.size());
  }
  return out;
}

std::string ChatTemplate::end_of_turn() const {
  static const std::string kProbe = "\x01zeroth\x01";
  const nlohmann::ordered_json turns = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "question"}}, {{"role", "assistant"}, {"content", kProbe}}});
  const std::string text = render(turns, false).text;
  const size_t at = text.rfind(kProbe);
  if (at != std::string::npos) {
    const size_t begin = text.find_first_not_of(" \t\r\n", at + kProbe.size());
    if (begin != std::string::npos) {
      const size_t end = text.find_first_of(" \t\r\n", begin);
      return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    }
  }
  return special_token("eos_token");
}

std::string ChatTemplate::special_token(const std::string& name) const {
  return special_tokens_.contains(name) ? special_tokens_[name].get<std::string>() : "";
}

}  // namespace zeroth
