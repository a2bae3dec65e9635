// Python's string and argument helpers the filters, tests and methods share.
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

#include "train/text/jinja/builtins.h"

namespace zeroth::jinja {

// str.strip(chars) (left, right or both); chars null: whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
// ASCII case mapping: Python maps every cased character, which chat templates do not rely on.
std::string upper(std::string s);
std::string lower(std::string s);
std::string title(std::string s);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count);
Value split(const Site& site, const std::string& s, const Value* sep, int64_t max);
bool starts_or_ends(const Site& site, const std::string& s, const Value& with, bool starts);
std::string escape_html(const std::string& s);
// A dotted attribute path of a value ("function.name"), undefined where a part is missing.
Value attribute_of(const Value& v, const std::string& path);

const Value* kwarg(const Kwargs& kwargs, const std::string& name);
// Argument `k` by position, else by name, else null.
const Value* argument(const Args& args, const Kwargs& kwargs, size_t k, const std::string& name);
const std::string& text(const Site& site, const Value& v, const std::string& what);
int64_t as_int(const Site& site, const Value& v, const std::string& what);

}  // namespace zeroth::jinja
