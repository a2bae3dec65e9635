// A folder for the offload tests' swap files on the disk the tests run from, removed when the
// test process ends (the swap files in it are unlinked as soon as they are made).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

namespace zeroth::testing {

inline const std::string& swap_dir() {
  struct Folder {
    std::string path;
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Folder dir{[] {
    const char* tmp = std::getenv("TMPDIR");
    std::string path = fmt::format("{}/zeroth-offload-test-{}", tmp != nullptr ? tmp : "/tmp", ::getpid());
    ::mkdir(path.c_str(), 0700);
    return path;
  }()};
  return dir.path;
}

}  // namespace zeroth::testing
