// Integers from JSON that comes from outside (a file's header, a manifest): JSON for Modern C++'s
// get<int>() casts a floating-point value to the integer type, which is undefined behaviour past
// the type's range (5e84 as a tensor's offset). These take only a JSON integer that fits.
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <limits>   // std::numeric_limits
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>

namespace zeroth {

// The integer `j` holds as a T; nlohmann::json::type_error (not an integer) or out_of_range
// (outside T) otherwise, which the callers' catch of nlohmann::json::exception turns into their
// format's error.
template <class T>
T json_int(const nlohmann::json& j) {
  using limits = std::numeric_limits<T>;
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v <= static_cast<uint64_t>(limits::max())) return static_cast<T>(v);
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= 0 ? static_cast<uint64_t>(v) <= static_cast<uint64_t>(limits::max())
               : limits::is_signed && v >= static_cast<int64_t>(limits::min()))
      return static_cast<T>(v);
  } else {
    throw nlohmann::json::type_error::create(302, "expected an integer, got " + j.dump(), &j);
  }
  throw nlohmann::json::out_of_range::create(406, "the integer " + j.dump() + " is out of range", &j);
}

// A JSON array of integers, each as json_int<T>.
template <class T>
std::vector<T> json_ints(const nlohmann::json& j) {
  if (!j.is_array()) throw nlohmann::json::type_error::create(302, "expected an array of integers, got " + j.dump(), &j);
  std::vector<T> out;
  out.reserve(j.size());
  for (const auto& v : j) out.push_back(json_int<T>(v));
  return out;
}

}  // namespace zeroth
