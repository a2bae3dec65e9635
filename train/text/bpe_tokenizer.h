// Hugging Face tokenizer.json files with a byte-level BPE model (GPT-2, Llama 3, Qwen2/3).
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string

#include "train/text/tokenizer.h"  // Tokenizer

namespace zeroth {

// `path`: a tokenizer.json. InvalidArgument naming the key it holds that zeroth cannot honour (a
// normalizer other than NFC, a pre-tokenizer other than Split and ByteLevel, a model that is not
// byte-level BPE), IoError where it cannot be read.
std::unique_ptr<Tokenizer> open_byte_level_bpe(const std::string& path);

}  // namespace zeroth
