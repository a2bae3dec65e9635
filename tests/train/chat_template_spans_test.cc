// The parts of a chat template's rendering the training and generation use, against what the
// templates' own formats put there: the assistant's spans (by prefixes, or by {% generation %}
// marks), where a reply ends, and a tokenizer folder's config as Hugging Face writes it.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <map>         // std::map
#include <string>      // std::string

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/train/chat_templates.h"
#include "train/text/chat_template.h"

namespace zeroth {
namespace {

using json = nlohmann::ordered_json;
using testing::templates;

// The trained spans against what the templates' own formats put there: ChatML without marks gives,
// by rendering prefixes, each assistant turn's content and its "<|im_end|>\n"; the marked template
// gives its marks; a template that rewrites earlier turns (Qwen3's reasoning) is refused.
TEST(ChatTemplate, AssistantSpansAreWhatEachAssistantTurnAdds) {
  auto source = [](const char* name) {
    for (const auto& t : templates())
      if (std::string(t.name) == name) return std::string(t.source);
    return std::string();
  };
  const json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const json talk = json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: what has keys?"},
                                   {"role": "assistant", "content": "A piano."}, {"role": "user", "content": "And teeth?"},
                                   {"role": "assistant", "content": "  A comb.\n"}])");
  const ChatTemplate chatml(source("smollm2"), "smollm2", special);
  const auto plain = chatml.render_assistant_spans(talk);
  ASSERT_EQ(plain.spans.size(), 2u);
  EXPECT_EQ(plain.text.substr(plain.spans[0].first, plain.spans[0].second - plain.spans[0].first), "A piano.<|im_end|>\n");
  EXPECT_EQ(plain.text.substr(plain.spans[1].first, plain.spans[1].second - plain.spans[1].first), "  A comb.\n<|im_end|>\n");

  const ChatTemplate marked(source("chatml-generation"), "chatml-generation", special);
  const auto by_marks = marked.render_assistant_spans(talk);
  ASSERT_EQ(by_marks.spans.size(), 2u);
  EXPECT_EQ(by_marks.text.substr(by_marks.spans[1].first, by_marks.spans[1].second - by_marks.spans[1].first), "A comb.<|im_end|>");

  // An empty assistant turn adds its end of turn only; the turns are counted as assistant turns.
  json empty_turn = talk;
  empty_turn[2]["content"] = "";
  const auto with_empty = chatml.render_assistant_spans(empty_turn);
  ASSERT_EQ(with_empty.spans.size(), 2u);
  EXPECT_EQ(with_empty.text.substr(with_empty.spans[0].first, with_empty.spans[0].second - with_empty.spans[0].first), "<|im_end|>\n");
  // A conversation the template refuses to begin is an error that says which prefix it was.
  const ChatTemplate mistral(source("mistral"), "mistral", special);
  try {
    mistral.render_assistant_spans(json::parse(R"([{"role": "assistant", "content": "first"}, {"role": "user", "content": "q"}])"));
    ADD_FAILURE() << "mistral's alternation was not enforced";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("mistral, line"), std::string::npos) << e.what();
  }
  const ChatTemplate qwen3(source("qwen3"), "qwen3", special);
  json thinking = talk;
  thinking[2]["content"] = "<think>\nkeys and strings\n</think>\n\nA piano.";
  try {
    qwen3.render_assistant_spans(thinking);
    ADD_FAILURE() << "a template that rewrites earlier turns gave spans";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3: rendering the conversation up to assistant turn 1 (message 2) is not a prefix"),
              std::string::npos)
        << e.what();
  }
}

// Where each family's reply ends, as its template writes it after an assistant's turn (Mistral's
// and Gemma's published end tokens: </s> is the eos_token Mistral's template appends, and Gemma's
// turn ends with <end_of_turn>).
TEST(ChatTemplate, TheEndOfTurnIsWhatTheTemplateWritesAfterAReply) {
  const json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const std::map<std::string, std::string> want = {{"llama3", "<|eot_id|>"},   {"qwen2.5", "<|im_end|>"},
                                                   {"qwen3", "<|im_end|>"},    {"mistral", "</s>"},
                                                   {"gemma", "<end_of_turn>"}, {"phi3", "<|end|>"},
                                                   {"smollm2", "<|im_end|>"},  {"chatml-generation", "<|im_end|>"}};
  size_t seen = 0;
  for (const auto& t : templates()) {
    if (!want.count(t.name)) continue;
    EXPECT_EQ(ChatTemplate(t.source, t.name, special).end_of_turn(), want.at(t.name)) << t.name;
    ++seen;
  }
  EXPECT_EQ(seen, want.size());
}

// tokenizer_config.json as Hugging Face writes it: the template a string or a list of named ones,
// the special tokens strings or AddedToken objects, which the template sees by name.
TEST(ChatTemplate, ReadsTheTokenizerFoldersConfig) {
  const std::string dir = fmt::format("{}/zeroth-chat-{}", ::testing::TempDir(), ::getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const json& config) { std::ofstream(dir + "/tokenizer_config.json") << config.dump(); };
  const json messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  write({{"chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
         {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
         {"eos_token", "</s>"}});
  EXPECT_EQ(ChatTemplate::from_folder(dir).render(messages, false).text, "<s>hi</s>");
  write({{"chat_template", json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                        {{"name", "default"}, {"template", "[{{ messages|length }}]"}}})}});
  EXPECT_EQ(ChatTemplate::from_folder(dir).render(messages, false).text, "[1]");
  // A file named in data.chat_template stands in for the config's.
  std::ofstream(dir + "/chat.jinja") << "{% if add_generation_prompt %}prompt{% endif %}";
  EXPECT_EQ(ChatTemplate::from_folder(dir, dir + "/chat.jinja").render(messages, true).text, "prompt");
  // A newer folder's chat_template.jinja beside the config is the template.
  std::ofstream(dir + "/chat_template.jinja") << "beside:{{ messages[0].content }}";
  EXPECT_EQ(ChatTemplate::from_folder(dir).render(messages, false).text, "beside:hi");
  std::filesystem::remove(dir + "/chat_template.jinja");
  write(json::object());
  try {
    ChatTemplate::from_folder(dir);
    ADD_FAILURE() << "a config without chat_template was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat_template and there is no chat_template.jinja beside it"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zeroth
