// The chat templates the tests render: written here in the manner of the families' published ones
// (Llama 3.x, Qwen2.5, Qwen3, Mistral, Gemma, Phi-3, SmolLM2), using the constructs those use, one
// that marks the assistant's part with {% generation %}, and one that uses every construct of the
// subset.
#pragma once

#include <vector>  // std::vector

namespace zeroth::testing {

struct Named {
  const char* name;
  const char* source;
};

inline const std::vector<Named>& templates() {
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
      // The marks inside a macro, whose output is a string placed by the loop.
      {"chatml-generation-macro", R"({%- macro turn(message) -%}
{{ '<|im_start|>' + message['role'] + '\n' }}
{%- if message['role'] == 'assistant' -%}
{% generation %}{{ message['content'] | trim + '<|im_end|>' }}{% endgeneration %}
{%- else -%}
{{ message['content'] | trim + '<|im_end|>' }}
{%- endif %}

{% endmacro -%}
{%- for message in messages %}{{ turn(message) }}{% endfor %}
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

}  // namespace zeroth::testing
