// What the harnesses share: the input as a file (the parsers under test take paths, as users give
// them), and the rule that a zeroth::Error is the one acceptable failure.
#pragma once

#include <fcntl.h>     // open
#include <stdlib.h>    // mkdtemp
#include <sys/mman.h>  // memfd_create
#include <unistd.h>    // ftruncate, pwrite

#include <cstddef>     // std::size_t
#include <cstdint>     // uint8_t
#include <cstdio>      // std::perror
#include <cstdlib>     // std::abort, std::atexit
#include <filesystem>  // std::filesystem::remove_all
#include <string>      // std::string

#include "core/error_types.h"  // zeroth::Error

namespace zeroth::fuzz {

// A file in memory, rewritten with each input, at a path any open() takes.
class InputFile {
 public:
  InputFile() {
    fd_ = ::memfd_create("zeroth-fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& path() const { return path_; }
  void write(const uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0 || (size > 0 && ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size))) {
      std::perror("writing the fuzz input");
      std::abort();
    }
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// A folder of its own, for parsers that take one (a checkpoint's step folder); removed with
// what is in it when the process exits normally, so replays in every ctest run leave nothing.
inline std::string temp_folder() {
  // Never destroyed, so the exit handler still finds the name.
  static const std::string* folder = [] {
    auto* made = new std::string("/tmp/zeroth-fuzz-XXXXXX");  // mkdtemp's template
    if (::mkdtemp(made->data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*folder, ec);
    });
    return made;
  }();
  return *folder;
}

// The harness of a parser that takes a path: the input written to a file, then parse(path); a
// zeroth::Error (a message naming what is wrong) is the one acceptable failure.
template <class Parse>
int on_file(const uint8_t* data, std::size_t size, Parse&& parse) {
  static InputFile file;
  file.write(data, size);
  try {
    parse(file.path());
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace zeroth::fuzz
