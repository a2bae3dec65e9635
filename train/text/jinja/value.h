// The values a chat template computes with, as Python's Jinja2 holds them: undefined, None, bool,
// int, float, str, list, dict (insertion-ordered), a namespace() and a macro. Lists and dicts are
// shared and never changed once made (Hugging Face renders in an immutable sandbox); a namespace's
// attributes are the one thing a template assigns through.
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::shared_ptr
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace zeroth::jinja {

struct Value;
struct MacroDef;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, macro };
  Kind kind = Kind::undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // the string; for undefined, what is missing, as an error says it
  std::shared_ptr<const List> list;  // list
  bool tuple = false;                // a list Python holds as a tuple: (a, b) when printed
  std::shared_ptr<Dict> dict;        // dict (not changed once made), namespace (assigned through)
  std::shared_ptr<const MacroDef> macro;

  static Value none() { return with(Kind::none); }
  static Value boolean(bool v) {
    Value x = with(Kind::boolean);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with(Kind::integer);
    x.i = v;
    return x;
  }
  static Value floating(double v) {
    Value x = with(Kind::floating);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = with(Kind::string);
    x.s = std::move(v);
    return x;
  }
  static Value undefined(std::string name) {
    Value x;
    x.s = std::move(name);
    return x;
  }
  static Value of_list(List items) {
    Value x = with(Kind::list);
    x.list = std::make_shared<const List>(std::move(items));
    return x;
  }
  static Value of_tuple(List items) {
    Value x = of_list(std::move(items));
    x.tuple = true;
    return x;
  }
  static Value of_dict(Dict items) {
    Value x = with(Kind::dict);
    x.dict = std::make_shared<Dict>(std::move(items));
    return x;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  double number() const { return kind == Kind::floating ? f : kind == Kind::boolean ? (b ? 1 : 0) : static_cast<double>(i); }
  // A dict's (or namespace's) entry, or null.
  const Value* find(const std::string& key) const;

 private:
  static Value with(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

// ASCII whitespace, between a tag's tokens.
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
// Python's whitespace as str.strip(), str.split() and Jinja's `-` see it (str.isspace(): ASCII's,
// \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000):
// the bytes of the one that starts at s[i], or of the one that ends at s[end - 1]; 0 for none.
size_t space_at(const std::string& s, size_t i);
size_t space_before(const std::string& s, size_t end);

// Python's truth of a value (undefined is false).
bool truthy(const Value& v);
// Python's ==, as Jinja compares (1 == 1.0 == True; undefined equals only undefined).
bool equal(const Value& a, const Value& b);
// What {{ v }} prints: str() of the value (undefined prints nothing).
std::string to_output(const Value& v);
// Python's repr() of the value: strings quoted, lists and dicts as Python prints them.
std::string python_repr(const Value& v);
// Python's repr() of a float: the shortest digits that read back the same, "1.0", "1e-05".
std::string python_float(double v);
// json.dumps's arguments as Hugging Face's tojson filter passes them; empty separators are
// json.dumps's defaults (", " or "," with an indent, and ": ").
struct JsonStyle {
  int indent = -1;  // none
  std::string item_separator, key_separator;
  bool sort_keys = false, ensure_ascii = false;
};
// json.dumps(v, ...) of a value of JSON's kinds (the caller refuses undefined, namespaces, macros).
std::string to_json(const Value& v, const JsonStyle& style = {});
// The name of the value's type as Python says it, for errors.
const char* type_name(const Value& v);

}  // namespace zeroth::jinja
