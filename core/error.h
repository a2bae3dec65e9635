// The checking macros that raise typed errors carrying the failing call, file and line.
#pragma once

#include <cerrno>  // errno

#include <fmt/format.h>  // fmt::format for the messages

#include "core/error_types.h"  // Error, InvalidArgument, ..., detail::where

// ZEROTH_CHECK(cond, "fmt", args...): raise InvalidArgument with the condition and message.
#define ZEROTH_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      throw ::zeroth::InvalidArgument(fmt::format(__VA_ARGS__) + " [check `" #cond "` at " + \
                                      ::zeroth::detail::where(__FILE__, __LINE__) + "]");    \
  } while (0)

// ZEROTH_THROW(Type, "fmt", args...): raise a typed error with the location appended.
#define ZEROTH_THROW(Type, ...) throw Type(fmt::format(__VA_ARGS__) + " [" + ::zeroth::detail::where(__FILE__, __LINE__) + "]")

// SYSCALL_CHECK(call): a POSIX call returning -1 and setting errno raises IoError with its text.
#define SYSCALL_CHECK(call)                                                                                         \
  ([&]() {                                                                                                          \
    auto zeroth_rc_ = (call);                                                                                       \
    if (zeroth_rc_ == -1) [[unlikely]] {                                                                            \
      const int zeroth_err_ = errno;                                                                                \
      throw ::zeroth::IoError(std::string(#call) + " failed: " + ::zeroth::detail::errno_text(zeroth_err_) + " [" + \
                              ::zeroth::detail::where(__FILE__, __LINE__) + "]");                                   \
    }                                                                                                               \
    return zeroth_rc_;                                                                                              \
  }())
