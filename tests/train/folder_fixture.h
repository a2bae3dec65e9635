// A test's own folder under the test temporary directory, removed after; files written into it
// plain, or gzip-compressed when the name ends in .gz.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>  // getpid
#include <zlib.h>    // gzopen, gzwrite

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <string>      // std::string

#include <fmt/format.h>

namespace zeroth::testing {

class Folder {
 public:
  explicit Folder(const std::string& name) : path_(fmt::format("{}/zeroth-jsonl-{}-{}", ::testing::TempDir(), name, ::getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~Folder() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    if (name.size() > 3 && name.substr(name.size() - 3) == ".gz") {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
      gzclose(f);
    } else {
      std::ofstream(p) << text;
    }
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace zeroth::testing
