// Chat templates against python3-jinja2 (Debian's), rendered as Hugging Face's apply_chat_template
// renders them (tests/reference/jinja_render.py): every template below over every conversation,
// with and without the generation prompt, byte for byte, and the {% generation %} spans at the same
// bytes. The templates (tests/train/chat_templates.h) are written in the manner of the families'
// published ones (Llama 3.x, Qwen2.5, Qwen3, Mistral, Gemma, Phi-3, SmolLM2), using the constructs
// those use, and one more that uses every construct of the subset.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdio>   // std::remove
#include <fstream>  // std::ofstream
#include <string>   // std::string
#include <vector>   // std::vector

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/text/chat_template.h"
#include "tests/train/chat_templates.h"
#include "tests/train/text_fixture.h"
#include "train/text/jinja/template.h"

namespace zeroth {
namespace {

using json = nlohmann::ordered_json;
using testing::templates;


json conversations() {
  return json::parse(R"([
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Riddle: what has keys but no locks?"}, {"role": "assistant", "content": "A piano."},
     {"role": "user", "content": "Another one, with \"quotes\", a back\\slash and\nnew lines\n"}, {"role": "assistant", "content": "\n  Spaced answer  \n"}],
    [{"role": "system", "content": "Réponds en français 🙂"}, {"role": "user", "content": "漢字とかなと絵文字🚀"},
     {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "call a tool"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"q": "piano", "n": 2}}}]},
     {"role": "tool", "content": "{\"result\": \"instrument\"}"}, {"role": "assistant", "content": "It is an instrument."}],
    [{"role": "user", "content": "a message long enough to stop the every-construct loop early"}, {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": [{"type": "text", "text": "  content as a list  "}]}, {"role": "assistant", "content": "seen"}],
    [{"role": "assistant", "content": "assistant first"}]
  ])");
}

struct Case {
  json variables;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& messages : conversations()) {
    for (bool prompt : {false, true}) {
      json v = {{"messages", messages}, {"tools", nullptr},   {"documents", nullptr}, {"add_generation_prompt", prompt},
                {"bos_token", "<s>"},   {"eos_token", "</s>"}};
      out.push_back({v});
    }
  }
  // Tools given, for the templates that list them.
  json v = {{"messages", conversations()[5]},
            {"documents", nullptr},
            {"add_generation_prompt", true},
            {"bos_token", "<s>"},
            {"eos_token", "</s>"}};
  v["tools"] = json::parse(R"([{"type": "function", "function": {"name": "lookup", "description": "Looks a word up.",
                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}])");
  out.push_back({v});
  v = {{"messages", conversations()[1]},
       {"tools", nullptr},
       {"documents", nullptr},
       {"add_generation_prompt", true},
       {"enable_thinking", false}};
  out.push_back({v});
  return out;
}

json jinja_reference(const json& request) {
  const std::string in = fmt::format("{}/zeroth-jinja-{}.json", ::testing::TempDir(), ::getpid());
  std::ofstream(in) << request.dump();
  // python3-jinja2 is Debian's reference here: tools/install-deps.sh test installs it.
  const std::string out = testing::shell(
      fmt::format("/usr/bin/python3 -X utf8 {}/tests/reference/jinja_render.py < {}", ZEROTH_SOURCE_DIR, in));
  std::remove(in.c_str());
  return json::parse(out);
}

TEST(ChatTemplate, RendersAsJinja2DoesByteForByte) {
  json request = {{"templates", json::array()}, {"cases", json::array()}};
  for (const auto& t : templates()) request["templates"].push_back({{"name", t.name}, {"source", t.source}});
  const auto all = cases();
  for (const auto& c : all) request["cases"].push_back({{"variables", c.variables}});
  const json reference = jinja_reference(request);
  ASSERT_TRUE(reference.contains("results")) << reference.dump();
  int compared = 0, refused = 0;
  for (size_t t = 0; t < templates().size(); ++t) {
    const jinja::Template mine(templates()[t].source, templates()[t].name);
    for (size_t c = 0; c < all.size(); ++c) {
      SCOPED_TRACE(fmt::format("template {}, case {}: {}", templates()[t].name, c, all[c].variables.dump()));
      const json& want = reference["results"][t][c];
      if (want.contains("error")) {
        // Jinja refused: so must zeroth, with the template's own words where it raised them.
        try {
          mine.render(jinja::Value::from_json(all[c].variables));
          ADD_FAILURE() << "jinja2 refused, zeroth rendered: " << want["error"];
        } catch (const InvalidArgument& e) {
          if (want.value("raised", false)) {
            EXPECT_NE(std::string(e.what()).find("the template raised an error: " + want["error"].get<std::string>()),
                      std::string::npos)
                << e.what();
          }
        }
        ++refused;
        continue;
      }
      const jinja::Rendered got = mine.render(jinja::Value::from_json(all[c].variables));
      EXPECT_EQ(got.text, want["text"].get<std::string>());
      std::vector<std::pair<size_t, size_t>> spans;
      for (const auto& s : want["generation"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
      EXPECT_EQ(got.generation, spans);
      ++compared;
    }
  }
  EXPECT_GE(compared, 150);
  EXPECT_GE(refused, 3);  // mistral's alternation and role checks
}

TEST(ChatTemplate, AConstructOutsideTheSubsetIsAnErrorNamingItAndItsLine) {
  auto error_of = [](const std::string& source) {
    try {
      jinja::Template t(source, "test.jinja");
      t.render(jinja::Value::from_json(json{{"messages", json::array()}}));
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      return m.substr(0, m.rfind(" ["));
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error_of("a\n{% include 'x' %}"), "test.jinja, line 2: the tag {% include %} is outside the chat-template subset (if, "
                                              "for, set, macro, generation, break, continue)");
  EXPECT_EQ(error_of("{{ x | wordwrap }}"), "test.jinja, line 1: the filter 'wordwrap' is outside the chat-template subset");
  EXPECT_EQ(error_of("\n\n{{ 'x' is sameish 'y' }}"), "test.jinja, line 3: the test 'sameish' is outside the chat-template subset");
  EXPECT_EQ(error_of("{% if true %}open"), "test.jinja: the template ends inside a block; expected {% endif %}");
  EXPECT_EQ(error_of("{{ 1 +"), "test.jinja, line 1: a {{ that is never closed with }}");
  EXPECT_EQ(error_of("{{ raise_exception('roles must alternate') }}"),
            "test.jinja, line 1: the template raised an error: roles must alternate");
  EXPECT_EQ(error_of("{{ messages[0].content.strip() }}"), "test.jinja, line 1: list object has no element 0");
  EXPECT_EQ(error_of("{% endfor %}"), "test.jinja, line 1: {% endfor %} with no open block it could close");
}


}  // namespace
}  // namespace zeroth
