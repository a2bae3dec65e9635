#include "train/text/tokenizer.h"

#include <algorithm>   // std::find
#include <cerrno>      // errno
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <iterator>    // std::istreambuf_iterator

#include <fmt/format.h>               // fmt::format
#include <nlohmann/json.hpp>          // nlohmann::json
#include <sentencepiece_processor.h>  // sentencepiece::SentencePieceProcessor
#include <xxhash.h>                   // XXH3_64bits

#include "core/error.h"                // ZEROTH_THROW
#include "train/text/bpe_tokenizer.h"  // open_byte_level_bpe

namespace zeroth {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ZEROTH_THROW(IoError, "open(\"{}\"): {}", path, std::strerror(errno));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Llama 2's tokenizer.model, or any SentencePiece model (unigram or BPE).
class SentencePiece final : public Tokenizer {
 public:
  explicit SentencePiece(const std::string& path) : path_(path) {
    const std::string bytes = read_file(path);
    fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      ZEROTH_THROW(InvalidArgument, "{} is not a SentencePiece model ({}); give a tokenizer.model that spm_train wrote", path,
                   status.ToString());
    }
    // Control pieces written in the text (<s>, </s> of a chat template) are their ids, as Hugging
    // Face's tokenizers take them; spm_encode would spell them out.
    for (int id = 0; id < sp_.GetPieceSize(); ++id)
      if (sp_.IsControl(id) && !sp_.IdToPiece(id).empty()) specials_.emplace_back(sp_.IdToPiece(id), id);
    newline_ = sp_.PieceToId("<0x0A>");
    if (newline_ == sp_.unk_id() || !sp_.IsByte(newline_)) {
      ZEROTH_THROW(InvalidArgument,
                   "{} has no piece for a newline: text is encoded line by line with a newline token between lines, which a "
                   "SentencePiece model holds as the byte piece <0x0A>; train it with --byte_fallback=true (as Llama 2's is)",
                   path);
    }
  }

  std::vector<int32_t> encode_text(std::string_view text, const EncodeProgress& progress, std::vector<size_t>* ends) const override {
    check_utf8(text, path_ + ": the text to encode");
    std::vector<int32_t> out;
    std::vector<int> ids;
    size_t at = 0, reported = 0;
    while (at <= text.size()) {
      size_t end = text.find('\n', at);
      const bool newline = end != std::string_view::npos;
      if (!newline) end = text.size();
      // The line's stretches between control pieces, each encoded alone.
      for (size_t from = at; from < end;) {
        size_t special_at = end, special_len = 0;
        int32_t special_id = -1;
        for (const auto& [piece, id] : specials_) {
          const size_t found = text.substr(0, end).find(piece, from);
          if (found != std::string_view::npos && (found < special_at || (found == special_at && piece.size() > special_len)))
            special_at = found, special_len = piece.size(), special_id = id;
        }
        if (special_at > from) encode_stretch(text, from, special_at, out, ids, ends);
        if (special_id >= 0) {
          out.push_back(special_id);
          if (ends != nullptr) ends->push_back(special_at + special_len);
        }
        from = special_at + special_len;
      }
      if (!newline) break;
      out.push_back(newline_);
      if (ends != nullptr) ends->push_back(end + 1);
      at = end + 1;
      if (progress && at - reported >= (size_t{1} << 20)) progress(at), reported = at;
    }
    if (progress) progress(text.size());
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    // Line by line, as encoded: each line's leading "▁" is the dummy prefix of its own encoding.
    std::string out;
    std::vector<int> line;
    auto flush = [&] {
      std::string text;
      const auto status = sp_.Decode(line, &text);
      if (!status.ok()) ZEROTH_THROW(InvalidArgument, "{}: decoding: {}", path_, status.ToString());
      out += text;
      line.clear();
    };
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size())
        ZEROTH_THROW(InvalidArgument, "{}: id {} is outside the vocabulary of {}", path_, id, vocab_size());
      if (id == newline_) {
        flush();
        out += '\n';
      } else {
        line.push_back(id);
      }
    }
    flush();
    return out;
  }

  int vocab_size() const override { return sp_.GetPieceSize(); }
  std::string describe() const override { return fmt::format("SentencePiece, {} pieces ({})", vocab_size(), path_); }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  // Text [from, to) of one line, without control pieces; with `ends`, where each piece ends.
  void encode_stretch(std::string_view text, size_t from, size_t to, std::vector<int32_t>& out, std::vector<int>& ids,
                      std::vector<size_t>* ends) const {
    if (ends == nullptr) {
      const auto status = sp_.Encode(text.substr(from, to - from), &ids);
      if (!status.ok()) ZEROTH_THROW(InvalidArgument, "{}: encoding the line at byte {}: {}", path_, from, status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
      return;
    }
    // The pieces' byte offsets, from the proto form of the same encoding.
    const auto pieces = sp_.EncodeAsImmutableProto(text.substr(from, to - from));
    for (size_t i = 0; i < pieces.pieces_size(); ++i) {
      const auto piece = pieces.pieces(static_cast<int>(i));
      out.push_back(static_cast<int32_t>(piece.id()));
      ends->push_back(from + piece.end());
    }
    // Whitespace the normalizer dropped at the stretch's end belongs to its last piece.
    if (pieces.pieces_size() > 0) ends->back() = to;
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control pieces and their ids
  int newline_ = -1;
  uint64_t fingerprint_ = 0;
};

// One token per byte.
class Bytes final : public Tokenizer {
 public:
  std::vector<int32_t> encode_text(std::string_view text, const EncodeProgress&, std::vector<size_t>* ends) const override {
    if (ends != nullptr)
      for (size_t i = 1; i <= text.size(); ++i) ends->push_back(i);
    return {reinterpret_cast<const unsigned char*>(text.data()), reinterpret_cast<const unsigned char*>(text.data()) + text.size()};
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (const int32_t id : ids) {
      if (id < 0 || id > 255) ZEROTH_THROW(InvalidArgument, "token id {} is not a byte (text data: one token per byte)", id);
      out += static_cast<char>(id);
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  std::string describe() const override { return "bytes"; }
  uint64_t fingerprint() const override { return 0x6279746573ULL; }
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::bytes() { return std::make_unique<Bytes>(); }

void check_utf8(std::string_view s, const std::string& where) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size() && !(n == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && n == 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // overlong; surrogates
    }
    if (ok && n == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90) && c <= 0xF4;  // overlong; past U+10FFFF
    }
    if (!ok) ZEROTH_THROW(InvalidArgument, "{} is not UTF-8: byte {} (0x{:02x}) begins no valid character", where, i, c);
    i += n;
  }
}

std::vector<std::string> write_hf_tokenizer_files(const std::string& path, const std::string& folder, int max_positions) {
  std::vector<std::string> written;
  std::error_code ec;
  auto copy = [&](const fs::path& from, const std::string& name) {
    // Exporting into the folder the tokenizer came from: it is there already.
    if (fs::equivalent(from, fs::path(folder) / name, ec)) {
      written.push_back(name);
      return;
    }
    fs::copy_file(from, fs::path(folder) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) ZEROTH_THROW(IoError, "copy_file(\"{}\", \"{}\"): {}", from.string(), (fs::path(folder) / name).string(), ec.message());
    written.push_back(name);
  };
  const fs::path from(path);
  const fs::path dir = fs::is_directory(from, ec) ? from : from.parent_path();
  if (fs::is_directory(from, ec)) {
    for (const char* name : {"tokenizer.model", "tokenizer.json"})
      if (fs::exists(from / name, ec)) copy(from / name, name);
  } else {
    copy(from, path.ends_with(".json") ? "tokenizer.json" : "tokenizer.model");
  }
  // What describes the tokenizer beside it belongs to it (a .model file's neighbours are not its).
  if (fs::is_directory(from, ec) || path.ends_with(".json")) {
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"})
      if (fs::exists(dir / name, ec)) copy(dir / name, name);
  }
  const bool sentencepiece = std::find(written.begin(), written.end(), "tokenizer.model") != written.end();
  const bool described = std::find(written.begin(), written.end(), "tokenizer_config.json") != written.end();
  if (sentencepiece && !described) {
    sentencepiece::SentencePieceProcessor sp;
    const std::string bytes = read_file((fs::path(folder) / "tokenizer.model").string());
    if (!sp.LoadFromSerializedProto(bytes).ok()) ZEROTH_THROW(InvalidArgument, "{} is not a SentencePiece model", path);
    auto piece = [&](int id) { return id >= 0 ? nlohmann::json(sp.IdToPiece(id)) : nlohmann::json(nullptr); };
    const nlohmann::json config = {{"tokenizer_class", "LlamaTokenizer"},
                                   {"unk_token", piece(sp.unk_id())},
                                   {"bos_token", piece(sp.bos_id())},
                                   {"eos_token", piece(sp.eos_id())},
                                   {"add_bos_token", false},
                                   {"add_eos_token", false},
                                   {"model_max_length", max_positions},
                                   {"clean_up_tokenization_spaces", false}};
    const fs::path out = fs::path(folder) / "tokenizer_config.json";
    std::ofstream f(out);
    f << config.dump(2) << "\n";
    f.flush();
    if (!f) ZEROTH_THROW(IoError, "writing {} failed: {}", out.string(), std::strerror(errno));
    written.push_back("tokenizer_config.json");
  }
  return written;
}

std::unique_ptr<Tokenizer> Tokenizer::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    // A Llama 2 or Mistral folder holds both: its tokenizer.json is SentencePiece's BPE recast,
    // which tokenizer.model states as SentencePiece itself runs it.
    if (const fs::path model = fs::path(path) / "tokenizer.model"; fs::exists(model, ec))
      return std::make_unique<SentencePiece>(model.string());
    if (const fs::path json = fs::path(path) / "tokenizer.json"; fs::exists(json, ec)) return open_byte_level_bpe(json.string());
    ZEROTH_THROW(InvalidArgument, "{} holds neither tokenizer.model (SentencePiece) nor tokenizer.json (Hugging Face)", path);
  }
  if (!fs::exists(path, ec)) {
    ZEROTH_THROW(IoError,
                 "the tokenizer {} does not exist; give a SentencePiece .model, a Hugging Face tokenizer.json, or their folder", path);
  }
  if (path.ends_with(".json")) return open_byte_level_bpe(path);
  return std::make_unique<SentencePiece>(path);
}

}  // namespace zeroth
