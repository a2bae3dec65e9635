#include "train/text/jinja/value.h"

#include <algorithm>  // std::stable_sort
#include <charconv>   // std::to_chars
#include <cmath>      // std::isnan, std::isinf
#include <cstdio>     // std::snprintf

#include <fmt/format.h>  // fmt::format

namespace zeroth::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return of_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e));
      return of_dict(std::move(items));
    }
    default: return Value();
  }
}

const Value* Value::find(const std::string& key) const {
  if ((kind != Kind::dict && kind != Kind::ns) || !dict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

namespace {

bool python_space(uint32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point UTF-8 encodes at s[i] and its length; length 0 for a malformed sequence.
std::pair<uint32_t, size_t> decode(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0, 0};
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) >> 6) != 2) return {0, 0};
    cp = (cp << 6) | (b(k) & 0x3f);
  }
  return {cp, n};
}

}  // namespace

size_t space_at(const std::string& s, size_t i) {
  if (i >= s.size()) return 0;
  const auto [cp, n] = decode(s, i);
  return n > 0 && python_space(cp) ? n : 0;
}

size_t space_before(const std::string& s, size_t end) {
  size_t start = end;
  while (start > 0 && end - start < 4) {
    --start;
    if ((static_cast<unsigned char>(s[start]) >> 6) != 2) break;
  }
  if (start == end) return 0;
  const auto [cp, n] = decode(s, start);
  return n == end - start && python_space(cp) ? n : 0;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.b;
    case Value::Kind::integer: return v.i != 0;
    case Value::Kind::floating: return v.f != 0;
    case Value::Kind::string: return !v.s.empty();
    case Value::Kind::list: return !v.list->empty();
    case Value::Kind::dict: return !v.dict->empty();
    case Value::Kind::ns:
    case Value::Kind::macro: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::floating && b.kind != K::floating)
      return (a.kind == K::boolean ? a.b : a.i) == (b.kind == K::boolean ? b.b : b.i);
    return a.number() == b.number();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::none: return true;
    case K::string: return a.s == b.s;
    case K::list: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case K::dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    }
    case K::ns: return a.dict == b.dict;
    case K::macro: return a.macro == b.macro;
    default: return false;
  }
}

std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // The shortest digits that read back to v, as d.ddd and a decimal exponent.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  // Python's repr: positional from 1e-4 up to (not including) 1e16, else scientific.
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." + digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  }
  return negative ? "-" + out : out;
}

namespace {

std::string python_quote(const std::string& s) {
  // Python prefers single quotes, and double ones when the text holds a single quote and no double.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && ensure_ascii) {
      auto [cp, n] = decode(s, i);
      if (n == 0) {
        cp = c;
        n = 1;
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
      i += n;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  const int indent = style.indent;
  const std::string newline = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string closing = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string comma = !style.item_separator.empty() ? style.item_separator : indent >= 0 ? "," : ", ";
  const std::string colon = !style.key_separator.empty() ? style.key_separator : ": ";
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.b ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.i); return;
    case Value::Kind::floating:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : python_float(v.f);
      return;
    case Value::Kind::string: json_string(out, v.s, style.ensure_ascii); return;
    case Value::Kind::list:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        out += k == 0 ? newline : comma + newline;
        json_value(out, (*v.list)[k], style, depth + 1);
      }
      out += closing + "]";
      return;
    case Value::Kind::dict:
    case Value::Kind::ns: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : *v.dict) items.push_back(&item);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        out += k == 0 ? newline : comma + newline;
        json_string(out, items[k]->first, style.ensure_ascii);
        out += colon;
        json_value(out, items[k]->second, style, depth + 1);
      }
      out += closing + "}";
      return;
    }
    case Value::Kind::macro: out += "null"; return;
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(out, v, style, 0);
  return out;
}

std::string python_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string: return python_quote(v.s);
    case Value::Kind::list: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + python_repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::dict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + python_quote((*v.dict)[k].first) + ": " + python_repr((*v.dict)[k].second);
      return out + "}";
    }
    default: return to_output(v);
  }
}

std::string to_output(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.b ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: return python_float(v.f);
    case Value::Kind::string: return v.s;
    case Value::Kind::list:
    case Value::Kind::dict: return python_repr(v);
    case Value::Kind::ns: return "<Namespace>";
    case Value::Kind::macro: return "<Macro>";
  }
  return "";
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return "dict";
    case Value::Kind::ns: return "Namespace";
    case Value::Kind::macro: return "Macro";
  }
  return "?";
}

}  // namespace zeroth::jinja
