// A checkpoint's manifest.json as a resume reads it: read_manifest of a step folder, then the
// lookups a load makes. A zeroth::Error (CheckpointError naming the file) is the one acceptable
// failure.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error_types.h"  // zeroth::Error
#include "engine/checkpoint/format.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string folder = zeroth::fuzz::temp_folder();
  static zeroth::fuzz::InputFile file;
  file.write(data, size);
  // The manifest at its place in the folder, as a link to the input.
  static const bool linked = [] {
    const std::string link = folder + "/manifest.json";
    return ::symlink(file.path().c_str(), link.c_str()) == 0;
  }();
  if (!linked) __builtin_trap();
  try {
    const auto manifest = zeroth::ckpt::read_manifest(folder);
    (void)manifest.data_bytes();
    for (const auto& tensor : manifest.tensors) (void)manifest.find(tensor.name);
    for (const auto& state : manifest.states) (void)manifest.state_index(state);
  } catch (const zeroth::Error&) {
  }
  return 0;
}
