// The typed errors zeroth raises. Free of fmt, so CUDA sources (nvcc) can include it.
#pragma once

#include <stdexcept>    // std::runtime_error
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth {

// Every error zeroth raises derives from Error, so `main` can turn any of them into one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
  using Error::Error;
};
class ConfigError : public Error {
  using Error::Error;
};
class IoError : public Error {
  using Error::Error;
};
class CommError : public Error {
  using Error::Error;
};
class CudaError : public Error {
  using Error::Error;
};
class OutOfMemory : public Error {
  using Error::Error;
};
// A checkpoint that cannot be used: missing, truncated or corrupted files, a manifest that does
// not parse or does not match the run. The message names the file and what is wrong.
class CheckpointError : public Error {
  using Error::Error;
};
// A run whose numbers went wrong for good (gradients non-finite step after step).
class NumericError : public Error {
  using Error::Error;
};

namespace detail {
std::string where(const char* file, int line);
// errno text for a failed system call ("open(...): No such file or directory (errno 2)").
std::string errno_text(int err);
// `message` without the " [dir/file.cc:123]" locations ZEROTH_THROW appends (nested ones too): what
// a user is shown. A failed ZEROTH_CHECK keeps its "[check `...` at ...]", which marks a bug.
std::string without_locations(std::string_view message);
}  // namespace detail

}  // namespace zeroth
