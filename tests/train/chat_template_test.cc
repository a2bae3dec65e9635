// Chat templates against python3-jinja2 (Debian's), rendered as Hugging Face's apply_chat_template
// renders them (tests/reference/jinja_render.py): every template below over every conversation,
// with and without the generation prompt, byte for byte, and the {% generation %} spans at the same
// bytes. The templates are written here in the manner of the families' published ones (Llama 3.x,
// Qwen2.5, Qwen3, Mistral, Gemma, Phi-3, SmolLM2), using the constructs those use, and one more
// that uses every construct of the subset.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdio>   // std::remove
#include <fstream>  // std::ofstream
#include <map>
#include <string>  // std::string
#include <vector>  // std::vector

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/text/chat_template.h"
#include "tests/train/text_fixture.h"
#include "train/text/jinja/template.h"

namespace zeroth {
namespace {

using json = nlohmann::ordered_json;

struct Named {
  const char* name;
  const char* source;
};

const std::vector<Named>& templates() {
  static const std::vector<Named> t = {
      {"llama3", R"({{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if system_message %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)"},
      {"qwen2.5", R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)"},
      {"qwen3", R"({%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system") %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})"},
      {"mistral", R"({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)"},
      {"gemma", R"({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)"},
      {"phi3", R"({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %})"},
      {"smollm2", R"({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})"},
      {"chatml-generation", R"({% for message in messages %}
{{ '<|im_start|>' + message['role'] + '\n' }}
{%- if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] | trim + '<|im_end|>' }}{% endgeneration %}
{%- else %}
{{ message['content'] | trim + '<|im_end|>' }}
{%- endif %}

{% endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
)"},
      {"crlf",
       "{% for m in messages %}\r\n  {{ m.role }}:\r\n{%- if m.content %} {{ m.content }}{% endif %}\r\n{% endfor %}\r\nend\r\n"},
      {"every-construct", R"({#- Each construct of the subset once at least. -#}
{% macro turn(role, text, tag='t', upper=false) -%}
<{{ tag }}:{{ role|upper if upper else role }}>{{ text }}</{{ tag }}>
{%- endmacro %}
{%- set ns = namespace(count=0, roles=[]) %}
{%- for m in messages if m.role != 'tool' %}
  {%- set ns.count = ns.count + 1 %}
  {%- set ns.roles = ns.roles + [m.role] %}
  {%- if m.content is not string %}{% continue %}{% endif %}
  {{ turn(m.role, m.content|trim, upper=loop.first) }} {{ loop.index }}/{{ loop.length }} {{ loop.revindex }} {{ loop.revindex0 }}
  {%- if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}
  {%- if loop.nextitem is defined %} next={{ loop.nextitem['role'] }}{% endif %}
  {%- if m.content|length > 40 %}{% break %}{% endif %}
{% else %}
no messages
{% endfor %}
count={{ ns.count }} roles={{ ns.roles|join(',') }} {{ ns.roles|length }} {{ ns.roles|first }} {{ ns.roles|last }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 1 + 2 * 3 - 4 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1.5e16 }} {{ 3.0 }}
{{ 'a' ~ 1 ~ none ~ true }} {{ [1, 'two', none, true, 2.5, {'k': 'v'}] }} {{ {'a': 1, 'b': [1, 2]} | tojson }}
{{ {'nested': {'list': [1, 'x'], 'q': "it's \"quoted\""}} | tojson(indent=2) }}
{{ "  padded  " | trim }}|{{ "xxhixx".strip('x') }}|{{ "  l".lstrip() }}|{{ "r  ".rstrip() }}|{{ 'Hello World'.lower() }}|{{ 'shout'.upper() }}
{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} {{ 'line1\nline2\r\nline3'.splitlines() }}
{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'hel')) }} {{ 'hello'.endswith('lo') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }}
{{ 'title me please'.title() }} {{ 'cAPITAL'.capitalize() }} {{ '-'.join(['x', 'y', 'z']) }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc' | replace('b', 'B') }}
{{ 'hello'[1] }} {{ 'hello'[-1] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[::2] }} {{ [1, 2, 3, 4, 5][-2:] }} {{ [1, 2, 3, 4, 5][:-2] }} {{ [1, 2, 3][5:] }}
{{ 'é漢🙂x'[1] }} {{ 'é漢🙂x'|length }} {{ 'é漢🙂x'[::-1] }} {{ 'é漢🙂x' | reverse }}
{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ none is none }} {{ 1 is number }} {{ 1.5 is float }} {{ 2 is integer }} {{ {} is mapping }} {{ [] is iterable }}
{{ undefined_name is defined }} {{ undefined_name is undefined }} {{ 'x' is string }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in [1, 2] }} {{ 1 is eq 1.0 }}
{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 2 in [1, 2] }} {{ 'ell' in 'hello' }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}
{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} {{ 0 or 'fallback' }} {{ 'first' and 'second' }} {{ not 0 }} {{ not not 'x' }} {{ (1, 2) }} {{ -(3) }} {{ +4 }}
{{ undefined_name | default('dflt') }} {{ '' | default('empty', true) }} {{ none | default('kept') }} {{ 'x' | d('y') }}
{{ {'b': 2, 'a': 1} | items | list }} {{ {'k': 'v'}.items() | list }} {{ {'k': 'v'}.keys() | list }} {{ {'k': 'v'}.values() | list }} {{ {'k': 'v'}.get('k') }} {{ {'k': 'v'}.get('z', 'dz') }} {{ {'k': 'v'}.get('z') }}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='role') | join('+') }} {{ messages | rejectattr('role', 'equalto', 'user') | list | length }}
{{ [3, 0, 1] | select | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | join }}
{{ '5' | int + 1 }} {{ 'x' | int }} {{ 3.9 | int }} {{ -3 | abs }} {{ 'a<b>"c"&\'d\'' | e }} {{ 'x' | safe }} {{ 'a\nb\n\nc' | indent(2) }} {{ 'a\nb' | indent(2, true) }}
{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ ([1] + [2, 3]) | length }} {{ 'ab' * 3 }}
{% set c = 0 %}{% for i in [1, 2, 3] %}{% set c = c + 1 %}{{ c }}{% if i == 1 %}{% set seen = 'x' %}{% endif %}[{{ seen }}]{% endfor %} {{ 'x' + 1 ~ 'y' }} {{ 2 * 3 ~ 4 }}
{{ 'a b  c  '.split(none, 1) }} {{ '5x' | int }} {{ '1e3' | int }} {{ ' 7 ' | int }} {{ '　wide　' | trim }}|{{ ' nbsp ' | trim }}
{{ {'b': 1, 'a': 'é🙂'} | tojson(sort_keys=true) }} {{ {'a': 'é🙂'} | tojson(true) }} {{ [1, {'k': 2}] | tojson(separators=(',', ':')) }} {{ tools is none }} {{ documents is none }}
{{ "adjacent " 'strings' }} {{ messages[0].role }} {{ messages.0.role }} {{ messages[0]['missing'] is defined }} {{ messages[99] is defined }}
  {%+ if true %}kept spaces{% endif %}
{%- if add_generation_prompt -%}
<generation>
{%- endif %}
    {% if false %}hidden{% elif messages|length > 2 %}many{% else %}few{% endif %}
{# a comment #}
end)"},
  };
  return t;
}

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
  for (const auto& t : templates()) {
    if (!want.count(t.name)) continue;
    EXPECT_EQ(ChatTemplate(t.source, t.name, special).end_of_turn(), want.at(t.name)) << t.name;
  }
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
