// Tokenizers the Llama family ships, turning text into the token ids a model trains on and back:
// a SentencePiece model (Llama 2, Mistral, TinyLlama: tokenizer.model, through Debian's
// libsentencepiece), a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3,
// Qwen2/3: train/text/bpe_tokenizer.cc); and text as bytes, what data.format "text" trains on without one.
#pragma once

#include <cstdint>      // int32_t
#include <functional>   // std::function
#include <memory>       // std::unique_ptr
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace zeroth {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // `path`: a SentencePiece .model file, a tokenizer.json, or a model folder holding either
  // (tokenizer.model first). IoError / InvalidArgument naming the path and what is wrong.
  static std::unique_ptr<Tokenizer> open(const std::string& path);
  // Text as bytes (data.format "text" without a tokenizer): id = byte, vocabulary 256.
  static std::unique_ptr<Tokenizer> bytes();

  // Called now and then while a text is encoded (about once a MiB), with the bytes of it done.
  using EncodeProgress = std::function<void(size_t bytes_done)>;
  // Text (UTF-8; InvalidArgument naming the byte offset where it is not) into ids, no special
  // tokens added (a tokenizer.json's added tokens in the text are recognized), the whole text in
  // one pass, so a run's cached tokens and `zeroth tokenize`'s are the same. SentencePiece encodes
  // lines one at a time, as its own spm_encode does, each newline then its own token (the model's
  // byte piece for "\n").
  std::vector<int32_t> encode(std::string_view text, const EncodeProgress& progress = {}) const {
    return encode_text(text, progress, nullptr);
  }
  // The same ids, and where each token ends in `text`: token i covers bytes [ends[i - 1], ends[i])
  // (from 0 for the first), as Hugging Face's offset mapping places it, so byte spans of the text
  // (a chat template's assistant turns) become token masks. Where a byte-level BPE's normalizer
  // changes a stretch between added tokens, that stretch's tokens all end where it ends.
  struct Encoded {
    std::vector<int32_t> ids;
    std::vector<size_t> ends;
  };
  Encoded encode_with_ends(std::string_view text) const {
    Encoded e;
    e.ids = encode_text(text, {}, &e.ends);
    return e;
  }
  // Ids back into text: decode(encode(t)) == t for text the model's normalization keeps as it is.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::string describe() const = 0;  // "SentencePiece unigram, 4096 pieces (tokenizer.model)"
  // A stamp of the model's bytes, so a cached tokenization is redone when the model changes.
  virtual uint64_t fingerprint() const = 0;

 protected:
  // `ends`: null, or where each id's token ends (encode_with_ends).
  virtual std::vector<int32_t> encode_text(std::string_view text, const EncodeProgress& progress, std::vector<size_t>* ends) const = 0;
};

// The tokenizer at `path` (as Tokenizer::open takes it) into a Hugging Face model folder: its
// tokenizer.model or tokenizer.json, and the tokenizer_config.json, special_tokens_map.json and
// added_tokens.json beside it; a SentencePiece model without a tokenizer_config.json gets one naming
// LlamaTokenizer, its special pieces, no BOS added (zeroth trains without one) and
// `max_positions`. Returns the file names written. IoError naming the file that cannot be copied.
std::vector<std::string> write_hf_tokenizer_files(const std::string& path, const std::string& folder, int max_positions);

// InvalidArgument naming `where` and the byte offset of the first byte that is not UTF-8.
void check_utf8(std::string_view text, const std::string& where);

}  // namespace zeroth
