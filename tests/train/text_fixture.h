// What the tokenizer tests share: a shell command's output, the fortunes as one text, the message
// of the error a call raises.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>    // popen
#include <fstream>   // std::ifstream
#include <iterator>  // std::istreambuf_iterator
#include <string>    // std::string

#include "core/error.h"  // Error

namespace zeroth::testing {

// What `fn` throws as zeroth's Error, or "no error".
inline std::string error_message(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// `cmd`'s standard output; a failure when it exits non-zero.
inline std::string shell(const std::string& cmd) {
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  char buf[65536];
  size_t n = 0;
  while (pipe != nullptr && (n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pipe != nullptr ? ::pclose(pipe) : -1, 0) << cmd;
  return out;
}

// Three of Debian's fortune files (about 390 KB of English), which tools/install-deps.sh installs.
inline std::string fortunes_text() {
  std::string text;
  for (const char* f : {"fortunes", "computers", "science"}) {
    std::ifstream in(std::string("/usr/share/games/fortunes/") + f, std::ios::binary);
    text += std::string(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_GT(text.size(), 100000u) << "the fortunes are not installed (tools/install-deps.sh)";
  return text;
}

}  // namespace zeroth::testing
