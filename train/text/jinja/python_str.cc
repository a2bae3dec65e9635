// Python's string methods and the argument helpers, as the filters and methods use them.
#include "train/text/jinja/python_str.h"

namespace zeroth::jinja {

using K = Value::Kind;

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars != nullptr && chars->is(K::string)) {
    const auto drop = [&](char c) { return chars->s.find(c) != std::string::npos; };
    if (left)
      while (b < e && drop(s[b])) ++b;
    if (right)
      while (e > b && drop(s[e - 1])) --e;
    return s.substr(b, e - b);
  }
  if (left)
    for (size_t n; b < e && (n = space_at(s, b)) > 0;) b += n;
  if (right)
    for (size_t n; e > b && (n = space_before(s, e)) > 0;) e -= n;
  return s.substr(b, e - b);
}

std::string upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}
std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
std::string title(std::string s) {
  bool start = true;
  for (char& c : s) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) c = start ? upper(std::string(1, c))[0] : lower(std::string(1, c))[0];
    start = !alpha;
  }
  return s;
}

const Value* kwarg(const Kwargs& kwargs, const std::string& name) {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}
const Value* argument(const Args& args, const Kwargs& kwargs, size_t k, const std::string& name) {
  if (k < args.size()) return &args[k];
  return kwarg(kwargs, name);
}

const std::string& text(const Site& site, const Value& v, const std::string& what) {
  if (!v.is(K::string)) site.fail(what + " needs a string, got " + type_name(v));
  return v.s;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t at = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out += s.substr(at, hit - at) + to;
    at = hit + from.size();
  }
  return out + s.substr(at);
}

Value split(const Site& site, const std::string& s, const Value* sep, int64_t max) {
  List parts;
  if (sep == nullptr || sep->is(K::none)) {
    size_t at = 0;
    while (true) {
      for (size_t n; (n = space_at(s, at)) > 0;) at += n;
      if (at >= s.size()) break;
      if (max >= 0 && static_cast<int64_t>(parts.size()) == max) {  // the rest as it is, its end's spaces kept
        parts.push_back(Value::string(s.substr(at)));
        break;
      }
      size_t end = at;
      while (end < s.size() && space_at(s, end) == 0) ++end;
      parts.push_back(Value::string(s.substr(at, end - at)));
      at = end;
    }
    return Value::of_list(std::move(parts));
  }
  const std::string& d = text(site, *sep, "split");
  if (d.empty()) site.fail("split: empty separator");
  size_t at = 0;
  while (max < 0 || static_cast<int64_t>(parts.size()) < max) {
    const size_t hit = s.find(d, at);
    if (hit == std::string::npos) break;
    parts.push_back(Value::string(s.substr(at, hit - at)));
    at = hit + d.size();
  }
  parts.push_back(Value::string(s.substr(at)));
  return Value::of_list(std::move(parts));
}

bool starts_or_ends(const Site& site, const std::string& s, const Value& with, bool starts) {
  auto one = [&](const Value& p) {
    const std::string& x = text(site, p, starts ? "startswith" : "endswith");
    return starts ? s.compare(0, x.size(), x) == 0 : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (with.is(K::list)) {
    for (const auto& p : *with.list)
      if (one(p)) return true;
    return false;
  }
  return one(with);
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t at = 0;
  while (at <= path.size()) {
    const size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const Value* next = cur.find(part);
    if (next == nullptr) return Value::undefined("'" + part + "' is undefined");
    cur = *next;
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return cur;
}

int64_t as_int(const Site& site, const Value& v, const std::string& what) {
  if (v.is(K::integer)) return v.i;
  if (v.is(K::boolean)) return v.b;
  site.fail(what + " needs an integer, got " + type_name(v));
}

}  // namespace zeroth::jinja
