// Python's operators, iteration and len() over template values, the methods of strings and dicts,
// and the global functions.
#include "train/text/jinja/builtins.h"

#include <cmath>  // std::floor, std::fmod, std::pow
#include <ctime>  // std::time, std::localtime, std::strftime

#include "core/error.h"  // ZEROTH_THROW
#include "train/text/jinja/python_str.h"

namespace zeroth::jinja {

void Site::fail(const std::string& what) const {
  if (line > 0) ZEROTH_THROW(InvalidArgument, "{}, line {}: {}", where, line, what);
  ZEROTH_THROW(InvalidArgument, "{}: {}", where, what);
}

using K = Value::Kind;

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t at = 0; at < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[at]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    out.push_back(s.substr(at, n));
    at += n;
  }
  return out;
}

int64_t length(const Site& site, const Value& v) {
  switch (v.kind) {
    case K::undefined: return 0;
    case K::string: return static_cast<int64_t>(characters(v.s).size());
    case K::list: return static_cast<int64_t>(v.list->size());
    case K::dict:
    case K::ns: return static_cast<int64_t>(v.dict->size());
    default: site.fail(std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

List iterate(const Site& site, const Value& v) {
  switch (v.kind) {
    case K::undefined: return {};
    case K::list: return *v.list;
    case K::dict: {
      List keys;
      for (const auto& [k, x] : *v.dict) keys.push_back(Value::string(k));
      return keys;
    }
    case K::string: {
      List chars;
      for (auto& c : characters(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default: site.fail(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

bool less(const Site& site, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() < b.number();
  if (a.is(K::string) && b.is(K::string)) return a.s < b.s;  // UTF-8 orders as code points do
  site.fail(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Site& site, const Value& container, const Value& item) {
  switch (container.kind) {
    case K::string:
      if (!item.is(K::string)) site.fail(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case K::list:
      for (const auto& x : *container.list)
        if (equal(x, item)) return true;
      return false;
    case K::dict:
    case K::ns: return item.is(K::string) && container.find(item.s) != nullptr;
    case K::undefined: return false;
    default: site.fail(std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

Value binary_op(const Site& site, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_output(a) + to_output(b));
  if (a.is(K::undefined) || b.is(K::undefined)) site.fail(a.is(K::undefined) ? a.s : b.s);
  const std::string unsupported = "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'";
  if (op == "+") {
    if (a.is(K::string) && b.is(K::string)) return Value::string(a.s + b.s);
    if (a.is(K::list) && b.is(K::list)) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(items));
    }
  }
  if (op == "*" && ((a.is(K::string) && b.is(K::integer)) || (a.is(K::integer) && b.is(K::string)))) {
    const std::string& s = a.is(K::string) ? a.s : b.s;
    std::string out;
    for (int64_t k = 0; k < (a.is(K::integer) ? a.i : b.i); ++k) out += s;
    return Value::string(out);
  }
  if (!a.is_number() || !b.is_number()) site.fail(unsupported);
  const bool ints = !a.is(K::floating) && !b.is(K::floating);
  const int64_t x = a.is(K::boolean) ? a.b : a.i, y = b.is(K::boolean) ? b.b : b.i;
  const double p = a.number(), q = b.number();
  if (op == "+") return ints ? Value::integer(x + y) : Value::floating(p + q);
  if (op == "-") return ints ? Value::integer(x - y) : Value::floating(p - q);
  if (op == "*") return ints ? Value::integer(x * y) : Value::floating(p * q);
  if (op == "/") {
    if (q == 0) site.fail("division by zero");
    return Value::floating(p / q);
  }
  if (op == "//" || op == "%") {
    if (q == 0) site.fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      int64_t d = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --d;
        m += y;
      }
      return Value::integer(op == "//" ? d : m);
    }
    const double m = std::fmod(p, q);
    const double fm = m != 0 && ((m < 0) != (q < 0)) ? m + q : m;
    return Value::floating(op == "//" ? std::floor(p / q) : fm);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < y; ++k) r *= x;
      return Value::integer(r);
    }
    return Value::floating(std::pow(p, q));
  }
  site.fail(unsupported);
}

Value call_method(const Site& site, const Value& obj, const std::string& name, const Args& args, const Kwargs& kwargs) {
  if (obj.is(K::string)) {
    const std::string& s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return Value::string(strip(s, argument(args, kwargs, 0, "chars"), name != "rstrip", name != "lstrip"));
    }
    if (name == "upper") return Value::string(upper(s));
    if (name == "lower") return Value::string(lower(s));
    if (name == "title") return Value::string(title(s));
    if (name == "capitalize") return apply_filter(site, "capitalize", obj, {}, {});
    if (name == "startswith" || name == "endswith") {
      if (args.empty()) site.fail(name + " needs an argument");
      return Value::boolean(starts_or_ends(site, s, args[0], name == "startswith"));
    }
    if (name == "split") {
      const Value* max = argument(args, kwargs, 1, "maxsplit");
      return split(site, s, argument(args, kwargs, 0, "sep"), max != nullptr ? as_int(site, *max, "split's maxsplit") : -1);
    }
    if (name == "replace") return apply_filter(site, "replace", obj, args, kwargs);
    if (name == "find" || name == "count") {
      if (args.empty()) site.fail(name + " needs an argument");
      const std::string& sub = text(site, args[0], name);
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(characters(s.substr(0, at)).size()));
      }
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos && !sub.empty(); at = s.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      if (args.empty()) site.fail("join needs an argument");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(site, args[0])) {
        out += (first ? "" : s) + text(site, x, "join");
        first = false;
      }
      return Value::string(out);
    }
    if (name == "splitlines") {
      List lines;
      size_t at = 0;
      while (at < s.size()) {
        size_t end = s.find('\n', at);
        if (end == std::string::npos) end = s.size();
        std::string line = s.substr(at, end - at);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(Value::string(line));
        at = end + 1;
      }
      return Value::of_list(std::move(lines));
    }
  }
  if (obj.is(K::dict)) {
    if (name == "items") return apply_filter(site, "items", obj, {}, {});
    if (name == "keys") return Value::of_list(iterate(site, obj));
    if (name == "values") {
      List values;
      for (const auto& [k, x] : *obj.dict) values.push_back(x);
      return Value::of_list(std::move(values));
    }
    if (name == "get") {
      if (args.empty()) site.fail("get needs a key");
      const Value* found = args[0].is(K::string) ? obj.find(args[0].s) : nullptr;
      return found != nullptr ? *found : (args.size() > 1 ? args[1] : Value::none());
    }
  }
  site.fail(std::string("'") + type_name(obj) + "' object has no method '" + name + "' in the chat-template subset");
}

bool call_global(const Site& site, const std::string& name, const Args& args, const Kwargs& kwargs, Value& out) {
  if (name == "raise_exception") {
    site.fail("the template raised an error: " + (args.empty() ? std::string() : to_output(args[0])));
  }
  if (name == "namespace" || name == "dict") {
    Dict attrs;
    for (const auto& [k, v] : kwargs) attrs.emplace_back(k, v);
    out = Value::of_dict(std::move(attrs));
    if (name == "namespace") out.kind = K::ns;
    return true;
  }
  if (name == "range") {
    if (args.empty() || args.size() > 3) site.fail("range takes 1 to 3 integers");
    int64_t start = 0, stop = 0, step = 1;
    if (args.size() == 1) {
      stop = as_int(site, args[0], "range");
    } else {
      start = as_int(site, args[0], "range");
      stop = as_int(site, args[1], "range");
      if (args.size() == 3) step = as_int(site, args[2], "range");
    }
    if (step == 0) site.fail("range() arg 3 must not be zero");
    List items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::integer(k));
    out = Value::of_list(std::move(items));
    return true;
  }
  if (name == "strftime_now") {
    if (args.empty()) site.fail("strftime_now needs a format");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, text(site, args[0], "strftime_now").c_str(), &local);
    out = Value::string(std::string(buf, n));
    return true;
  }
  return false;
}

}  // namespace zeroth::jinja
