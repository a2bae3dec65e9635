// An llm.c token file as the data loader maps it: TokenData::open_bin, then every token read
// once. A zeroth::Error naming the file is the one acceptable failure.
#include <cstddef>
#include <cstdint>

#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "train/data.h"  // TokenData

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return zeroth::fuzz::on_file(data, size, [](const std::string& path) {
    const auto tokens = zeroth::TokenData::open_bin(path);
    int64_t sum = tokens.max_token();
    for (size_t i = 0; i < tokens.size(); ++i) sum += tokens[i];
    if (tokens.size() > 1) sum += tokens.slice(1, tokens.size())[0];
    (void)sum;
  });
}
