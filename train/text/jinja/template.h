// A Jinja template of the subset that published chat templates use, rendered as Hugging Face's
// apply_chat_template renders it (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loop controls; its tojson, raise_exception and strftime_now; and the
// {% generation %} marks of its assistant tracker).
#pragma once

#include <cstddef>  // size_t
#include <memory>   // std::shared_ptr
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "train/text/jinja/value.h"

namespace zeroth::jinja {

struct Node;

struct Rendered {
  std::string text;
  // The output's byte ranges [begin, end) that {% generation %} blocks wrote, in order.
  std::vector<std::pair<size_t, size_t>> generation;
};

class Template {
 public:
  // Parses `source`; `where` names it in every error ("<folder>/tokenizer_config.json's
  // chat_template"). InvalidArgument for a syntax error or a construct outside the subset, with
  // its line.
  Template(const std::string& source, std::string where);
  ~Template();
  Template(Template&&) noexcept;

  // The template over `variables` (a dict: messages, add_generation_prompt, bos_token, ...).
  Rendered render(const Value& variables) const;
  const std::string& where() const { return where_; }

 private:
  std::string where_;
  std::shared_ptr<const std::vector<Node>> nodes_;
};

}  // namespace zeroth::jinja
