// The filters (x | trim) and tests (x is defined) of the chat-template subset.
#include <algorithm>  // std::reverse
#include <charconv>   // std::from_chars
#include <cmath>      // std::fabs
#include <cstdlib>    // std::llabs

#include "train/text/jinja/builtins.h"
#include "train/text/jinja/python_str.h"

namespace zeroth::jinja {

using K = Value::Kind;

namespace {

bool json_serializable(const Value& v) {
  switch (v.kind) {
    case K::undefined:
    case K::ns:
    case K::macro: return false;
    case K::list:
      for (const auto& x : *v.list)
        if (!json_serializable(x)) return false;
      return true;
    case K::dict:
      for (const auto& [k, x] : *v.dict)
        if (!json_serializable(x)) return false;
      return true;
    default: return true;
  }
}

}  // namespace

// Long: one branch of a few lines per filter of the subset, each as Jinja defines it; the list is the
// subset's filters, read in one place.
Value apply_filter(const Site& site, const std::string& name, const Value& v, const Args& args, const Kwargs& kwargs) {
  // Jinja's string filters take str() of any value (soft_str).
  if (name == "trim") return Value::string(strip(to_output(v), argument(args, kwargs, 0, "chars"), true, true));
  if (name == "tojson") {
    // Hugging Face's: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    for (const auto& [key, x] : kwargs)
      if (key != "ensure_ascii" && key != "indent" && key != "separators" && key != "sort_keys")
        site.fail("tojson has no argument " + key);
    if (args.size() > 4) site.fail("tojson takes at most 4 arguments");
    if (!json_serializable(v)) site.fail("tojson: the value holds an undefined value, a namespace or a macro, which JSON cannot hold");
    JsonStyle style;
    if (const Value* a = argument(args, kwargs, 0, "ensure_ascii")) style.ensure_ascii = truthy(*a);
    if (const Value* a = argument(args, kwargs, 1, "indent"); a != nullptr && !a->is(K::none)) {
      style.indent = static_cast<int>(as_int(site, *a, "tojson's indent"));
    }
    if (const Value* a = argument(args, kwargs, 2, "separators"); a != nullptr && !a->is(K::none)) {
      if (!a->is(K::list) || a->list->size() != 2) site.fail("tojson's separators must be two strings (item, key)");
      style.item_separator = text(site, (*a->list)[0], "tojson's separators");
      style.key_separator = text(site, (*a->list)[1], "tojson's separators");
    }
    if (const Value* a = argument(args, kwargs, 3, "sort_keys")) style.sort_keys = truthy(*a);
    return Value::string(to_json(v, style));
  }
  if (name == "length" || name == "count") return Value::integer(length(site, v));
  if (name == "string") return Value::string(to_output(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value::string(escape_html(to_output(v)));
  if (name == "upper") return Value::string(upper(to_output(v)));
  if (name == "lower") return Value::string(lower(to_output(v)));
  if (name == "title") return Value::string(title(to_output(v)));
  if (name == "capitalize") {
    std::string s = lower(to_output(v));
    if (!s.empty()) s[0] = upper(s.substr(0, 1))[0];
    return Value::string(s);
  }
  if (name == "default" || name == "d") {
    const Value* fallback = argument(args, kwargs, 0, "default_value");
    const Value* boolean = argument(args, kwargs, 1, "boolean");
    const bool use = v.is(K::undefined) || (boolean != nullptr && truthy(*boolean) && !truthy(v));
    return use ? (fallback != nullptr ? *fallback : Value::string("")) : v;
  }
  if (name == "items") {
    if (!v.is(K::dict)) site.fail(std::string("items needs a dict, got ") + type_name(v));
    List pairs;
    for (const auto& [k, x] : *v.dict) pairs.push_back(Value::of_tuple({Value::string(k), x}));
    return Value::of_list(std::move(pairs));
  }
  if (name == "list") return Value::of_list(iterate(site, v));
  if (name == "first" || name == "last") {
    const List items = iterate(site, v);
    if (items.empty()) return Value::undefined("the sequence has no " + name + " item");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is(K::string)) {
      auto chars = characters(v.s);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value::string(out);
    }
    List items = iterate(site, v);
    std::reverse(items.begin(), items.end());
    return Value::of_list(std::move(items));
  }
  if (name == "join") {
    const Value* sep = argument(args, kwargs, 0, "d");
    const Value* attr = argument(args, kwargs, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& x : iterate(site, v)) {
      out += first ? "" : (sep != nullptr ? to_output(*sep) : "");
      out += to_output(attr != nullptr ? attribute_of(x, to_output(*attr)) : x);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    const Value* count = argument(args, kwargs, 2, "count");
    if (args.size() < 2) site.fail("replace needs the old and the new string");
    return Value::string(replace_all(to_output(v), to_output(args[0]), to_output(args[1]),
                                     count != nullptr ? as_int(site, *count, "replace's count") : -1));
  }
  if (name == "int") {
    if (v.is(K::integer)) return v;
    if (v.is(K::floating)) return Value::integer(static_cast<int64_t>(v.f));
    if (v.is(K::boolean)) return Value::integer(v.b);
    if (v.is(K::string)) {
      // Python's int(s), else int(float(s)): the whole string, spaces around it allowed.
      const std::string t = strip(v.s, nullptr, true, true);
      int64_t i = 0;
      const char* first = t.data() + (!t.empty() && t[0] == '+' ? 1 : 0);
      if (!t.empty() && std::from_chars(first, t.data() + t.size(), i).ptr == t.data() + t.size()) return Value::integer(i);
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
    }
    const Value* fallback = argument(args, kwargs, 0, "default");
    return fallback != nullptr ? *fallback : Value::integer(0);
  }
  if (name == "abs") {
    if (v.is(K::floating)) return Value::floating(std::fabs(v.f));
    return Value::integer(std::llabs(as_int(site, v, "abs")));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (args.empty()) site.fail(name + " needs an attribute name");
    const std::string attr = to_output(args[0]);
    List kept;
    for (const auto& x : iterate(site, v)) {
      const Value a = attribute_of(x, attr);
      bool pass = truthy(a);
      if (args.size() >= 2) pass = apply_test(site, to_output(args[1]), a, Args(args.begin() + 2, args.end()));
      if (pass == (name == "selectattr")) kept.push_back(x);
    }
    return Value::of_list(std::move(kept));
  }
  if (name == "select" || name == "reject") {
    List kept;
    for (const auto& x : iterate(site, v)) {
      const bool pass = args.empty() ? truthy(x) : apply_test(site, to_output(args[0]), x, Args(args.begin() + 1, args.end()));
      if (pass == (name == "select")) kept.push_back(x);
    }
    return Value::of_list(std::move(kept));
  }
  if (name == "map") {
    List mapped;
    const Value* attr = kwarg(kwargs, "attribute");
    for (const auto& x : iterate(site, v)) {
      if (attr != nullptr) mapped.push_back(attribute_of(x, to_output(*attr)));
      else if (!args.empty()) mapped.push_back(apply_filter(site, to_output(args[0]), x, Args(args.begin() + 1, args.end()), {}));
      else site.fail("map needs attribute= or a filter name");
    }
    return Value::of_list(std::move(mapped));
  }
  if (name == "indent") {
    const Value* width = argument(args, kwargs, 0, "width");
    const Value* first = argument(args, kwargs, 1, "first");
    const std::string pad(static_cast<size_t>(width != nullptr ? as_int(site, *width, "indent's width") : 4), ' ');
    const std::string s = to_output(v);
    std::string out = first != nullptr && truthy(*first) ? pad : "";
    for (size_t k = 0; k < s.size(); ++k) {
      out += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
    }
    return Value::string(out);
  }
  site.fail("the filter '" + name + "' is outside the chat-template subset");
}

bool apply_test(const Site& site, const std::string& name, const Value& v, const Args& args) {
  auto arg = [&]() -> const Value& {
    if (args.empty()) site.fail("the test '" + name + "' needs an argument");
    return args[0];
  };
  if (name == "defined") return !v.is(K::undefined);
  if (name == "undefined") return v.is(K::undefined);
  if (name == "none") return v.is(K::none);
  if (name == "boolean") return v.is(K::boolean);
  if (name == "true") return v.is(K::boolean) && v.b;
  if (name == "false") return v.is(K::boolean) && !v.b;
  if (name == "string") return v.is(K::string);
  if (name == "number") return v.is(K::integer) || v.is(K::floating);
  if (name == "integer") return v.is(K::integer);
  if (name == "float") return v.is(K::floating);
  if (name == "mapping") return v.is(K::dict);
  if (name == "iterable") return v.is(K::list) || v.is(K::dict) || v.is(K::string);
  if (name == "sequence") return v.is(K::list) || v.is(K::dict) || v.is(K::string);
  if (name == "callable") return v.is(K::macro);
  if (name == "odd") return as_int(site, v, "odd") % 2 != 0;
  if (name == "even") return as_int(site, v, "even") % 2 == 0;
  if (name == "divisibleby") return as_int(site, v, "divisibleby") % as_int(site, arg(), "divisibleby") == 0;
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg());
  if (name == "ne" || name == "!=") return !equal(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return less(site, v, arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(site, arg(), v);
  if (name == "le" || name == "<=") return !less(site, arg(), v);
  if (name == "ge" || name == ">=") return !less(site, v, arg());
  if (name == "in") return contains(site, arg(), v);
  if (name == "sameas") return equal(v, arg()) && v.kind == arg().kind;
  if (name == "lower") return v.is(K::string) && lower(v.s) == v.s;
  if (name == "upper") return v.is(K::string) && upper(v.s) == v.s;
  site.fail("the test '" + name + "' is outside the chat-template subset");
}

}  // namespace zeroth::jinja
