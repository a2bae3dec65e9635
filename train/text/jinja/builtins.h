// What a chat template calls by name: the filters (x | trim), the tests (x is defined), the
// methods of strings and dicts (x.strip(), d.items()) and the global functions (namespace, range,
// raise_exception, strftime_now), with Python's behaviour for each. Each throws InvalidArgument
// naming the template, the line and what was wrong.
#pragma once

#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "train/text/jinja/value.h"

namespace zeroth::jinja {

// Where an error is said to be: the template and the line.
struct Site {
  const std::string& where;
  int line;
  [[noreturn]] void fail(const std::string& what) const;
};

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

Value apply_filter(const Site& site, const std::string& name, const Value& v, const Args& args, const Kwargs& kwargs);
bool apply_test(const Site& site, const std::string& name, const Value& v, const Args& args);
Value call_method(const Site& site, const Value& obj, const std::string& name, const Args& args, const Kwargs& kwargs);
// A global function; false when `name` is none.
bool call_global(const Site& site, const std::string& name, const Args& args, const Kwargs& kwargs, Value& out);

// Python's operators over values (+ - * / // % ** ~ and the comparisons < <= > >=, `in`).
Value binary_op(const Site& site, const std::string& op, const Value& a, const Value& b);
bool less(const Site& site, const Value& a, const Value& b);
bool contains(const Site& site, const Value& container, const Value& item);
// The items a for loop walks: a list's, a dict's keys, a string's characters; none for undefined.
List iterate(const Site& site, const Value& v);
// Python's len().
int64_t length(const Site& site, const Value& v);
// A string's characters as UTF-8 pieces (Python indexes and slices by character).
std::vector<std::string> characters(const std::string& s);

}  // namespace zeroth::jinja
