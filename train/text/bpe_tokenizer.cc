// A Hugging Face tokenizer.json holding a byte-level BPE model (GPT-2, Llama 3, Qwen2/3), encoded
// and decoded as Hugging Face's tokenizers library does: added tokens found in the raw text first
// (leftmost, then longest), the rest normalized (NFC, through utf8proc), cut by the pre-tokenizer
// (train/text/pre_tokenizer.h), each piece's bytes mapped to GPT-2's printable characters and merged by
// rank.
#include "train/text/bpe_tokenizer.h"

#include "train/text/pre_tokenizer.h"  // PreTokenizer

#include <utf8proc.h>  // utf8proc_map

#include <algorithm>      // std::min
#include <array>          // std::array
#include <cstdlib>        // std::free
#include <fstream>        // std::ifstream
#include <iterator>       // std::istreambuf_iterator
#include <limits>         // std::numeric_limits
#include <functional>     // std::greater
#include <memory>         // std::unique_ptr
#include <queue>          // std::priority_queue
#include <unordered_map>  // std::unordered_map

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json
#include <xxhash.h>           // XXH3_64bits

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

using json = nlohmann::json;

constexpr size_t kCacheEntries = 1 << 20;   // pieces remembered while encoding a text
constexpr size_t kProgressBytes = 1 << 20;  // encode's progress calls, about one per MiB

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's printable stand-in for each byte: the printable Latin-1 bytes stand for themselves, the
// others for U+0100 onwards in byte order.
std::array<std::string, 256> byte_chars() {
  std::array<std::string, 256> out;
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    append_utf8(out[b], printable ? b : 256 + extra++);
  }
  return out;
}

// Bytes as UTF-8 text, each maximal ill-formed subsequence replaced by U+FFFD (as Rust's
// String::from_utf8_lossy and the WHATWG decoder do).
std::string utf8_lossy(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c), ++i;
      continue;
    }
    const size_t n = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    size_t k = 1;
    for (; n > 0 && k < n && i + k < s.size(); ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      // The second byte's narrower ranges exclude overlongs, surrogates and code points past U+10FFFF.
      const unsigned char lo = k > 1 ? 0x80 : c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = k > 1 ? 0xBF : c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      if (b < lo || b > hi) break;
    }
    if (n > 0 && k == n) {
      out.append(s.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += n > 0 ? k : 1;
  }
  return out;
}

class ByteLevelBpe final : public Tokenizer {
 public:
  explicit ByteLevelBpe(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) ZEROTH_THROW(IoError, "open(\"{}\"): {}", path, std::strerror(errno));
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
    json j;
    try {
      j = json::parse(bytes);
    } catch (const json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "{} is not JSON ({}); give a Hugging Face tokenizer.json", path, e.what());
    }
    try {
      load(j);
    } catch (const json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "{}: a key of the wrong type or missing ({}); is it a Hugging Face tokenizer.json?", path,
                   e.what());
    }
  }

  std::vector<int32_t> encode_text(std::string_view text, const EncodeProgress& progress, std::vector<size_t>* ends) const override {
    check_utf8(text, path_ + ": the text to encode");
    std::vector<int32_t> out;
    // A text repeats its words; the cache is bounded so a corpus of unique strings stays small.
    std::unordered_map<std::string, Merged> cache;
    size_t done = 0, reported = 0;
    // Where a token ends, as a pointer into `text` (or, for a normalized stretch that differs from
    // the text, the stretch's end there).
    auto emit = [&](int32_t id, const char* end) {
      out.push_back(id);
      if (ends != nullptr) ends->push_back(static_cast<size_t>(end - text.data()));
    };
    split_added(text, false, emit, [&](std::string_view raw) {
      std::string normalized = normalize(raw);
      const bool same = normalized == raw;
      const std::string_view plain_text = same ? raw : std::string_view(normalized);
      const char* raw_end = raw.data() + raw.size();
      auto emit_here = [&](int32_t id, const char* end) { emit(id, same ? end : raw_end); };
      // A piece's tokens end at their bytes' places in plain_text (a space the pre-tokenizer put
      // first takes no byte of it).
      auto piece = [&](std::string_view p, size_t origin, bool inserted) {
        auto it = cache.find(std::string(p));
        if (it == cache.end()) {
          if (cache.size() >= kCacheEntries) cache.clear();
          it = cache.emplace(std::string(p), merge(p)).first;
        }
        const size_t shift = inserted ? 1 : 0;
        for (size_t i = 0; i < it->second.ids.size(); ++i) {
          const size_t end = it->second.ends[i];
          emit_here(it->second.ids[i], plain_text.data() + origin + (end > shift ? end - shift : 0));
        }
        done += p.size();
        if (progress && done - reported >= kProgressBytes) progress(std::min(done, text.size())), reported = done;
      };
      split_added(plain_text, true, emit_here, [&](std::string_view plain) {
        const size_t at = static_cast<size_t>(plain.data() - plain_text.data());
        pre_tokenizer_.for_each_piece(plain,
                                      [&](std::string_view p, size_t origin, bool inserted) { piece(p, at + origin, inserted); });
      });
    });
    if (progress) progress(text.size());
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string bytes;
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size())
        ZEROTH_THROW(InvalidArgument, "{}: id {} is outside the vocabulary of {}", path_, id, vocab_size());
      const std::string& token = tokens_[id];
      // A token's characters back to the bytes they stand for; one holding a character that
      // stands for no byte (an added token's space) is its own UTF-8, as Hugging Face decodes it.
      std::string mine;
      bool mapped = true;
      for (size_t i = 0; i < token.size() && mapped;) {
        size_t n = 1;
        while (i + n < token.size() && (static_cast<unsigned char>(token[i + n]) & 0xC0) == 0x80) ++n;
        const auto it = char_to_byte_.find(token.substr(i, n));
        mapped = it != char_to_byte_.end();
        if (mapped) mine += static_cast<char>(it->second);
        i += n;
      }
      bytes += mapped ? mine : token;
    }
    return utf8_lossy(bytes);
  }

  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  std::string describe() const override {
    return fmt::format("byte-level BPE, {} tokens, {} merges ({})", vocab_size(), merges_.size(), path_);
  }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  struct Added {
    std::string content;
    std::string match;  // what is found in the text: the content, normalized for a normalized token
    int32_t id;
    bool normalized, lstrip, rstrip, single_word;
  };
  struct Merge {
    int32_t rank, id;
  };

  void load(const json& j) {
    const json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE") {
      ZEROTH_THROW(InvalidArgument,
                   "{}: model.type is {}; zeroth reads byte-level BPE tokenizer.json files (or a SentencePiece .model)", path_,
                   model["type"].dump());
    }
    // Hugging Face writes "" where there is none (GPT-2's, Qwen's files); an unk_token is never
    // used by a vocabulary that holds every byte.
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && model[key] != "")
        ZEROTH_THROW(InvalidArgument, "{}: model.{} is {}; a byte-level BPE model has none, and zeroth honours no other", path_, key,
                     model[key].dump());
    }
    if (model.value("byte_fallback", false)) {
      ZEROTH_THROW(InvalidArgument,
                   "{}: model.byte_fallback is set: this is a SentencePiece-style BPE, not a byte-level one; give the folder's "
                   "tokenizer.model instead",
                   path_);
    }
    ignore_merges_ = model.value("ignore_merges", false);
    load_normalizer(j.contains("normalizer") ? j["normalizer"] : json());  // before the added tokens it normalizes
    const json added = j.value("added_tokens", json::array());
    // Ids run from 0 with no gap: none can pass the count of tokens.
    const int64_t count = static_cast<int64_t>(model.at("vocab").size() + added.size());
    for (int b = 0; b < 256; ++b) char_to_byte_.emplace(byte_chars_[b], static_cast<unsigned char>(b));
    for (const auto& [token, id] : model.at("vocab").items()) {
      const int64_t i = id.get<int64_t>();
      if (i < 0 || i >= count)
        ZEROTH_THROW(InvalidArgument, "{}: model.vocab gives \"{}\" the id {}, outside 0 .. {} (the count of tokens less one)", path_,
                     token, i, count - 1);
      vocab_.emplace(token, i);
      put_token(i, token);
    }
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab_.find(byte_chars_[b]);
      if (it == vocab_.end()) {
        ZEROTH_THROW(InvalidArgument, "{}: model.vocab has no token for the byte 0x{:02x} (\"{}\"): not a byte-level BPE vocabulary",
                     path_, b, byte_chars_[b]);
      }
      byte_id_[b] = it->second;
    }
    const json& merges = model.at("merges");
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string a, b;
      if (merges[r].is_string()) {
        const std::string m = merges[r];
        const size_t space = m.find(' ');
        if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos)
          ZEROTH_THROW(InvalidArgument, "{}: merge {} (\"{}\") is not two tokens with one space between", path_, r, m);
        a = m.substr(0, space), b = m.substr(space + 1);
      } else {
        a = merges[r].at(0), b = merges[r].at(1);
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        ZEROTH_THROW(InvalidArgument, "{}: merge {} (\"{}\" \"{}\") names a token model.vocab lacks", path_, r, a, b);
      merges_.try_emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(r), iab->second});
    }
    for (const json& t : added) {
      const int64_t id = t.at("id").get<int64_t>();
      Added a{t.at("content"),          t.at("content"),          static_cast<int32_t>(id),     t.value("normalized", false),
              t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)};
      if (a.content.empty() || id < 0 || id >= count) {
        ZEROTH_THROW(InvalidArgument, "{}: the added token \"{}\" has the id {}: give it a non-empty content and an id in 0 .. {}",
                     path_, a.content, id, count - 1);
      }
      if (a.id < static_cast<int32_t>(tokens_.size()) && has_token_[a.id] && tokens_[a.id] != a.content) {
        ZEROTH_THROW(InvalidArgument, "{}: the added token \"{}\" has the id {}, which model.vocab gives to \"{}\"", path_, a.content,
                     a.id, tokens_[a.id]);
      }
      // Hugging Face finds a normalized token in the normalized text, as the normalizer writes it.
      if (a.normalized) a.match = normalize(a.content);
      put_token(a.id, a.content);
      added_.push_back(std::move(a));
    }
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (!has_token_[i])
        ZEROTH_THROW(InvalidArgument, "{}: no token has the id {} (below the largest, {})", path_, i, tokens_.size() - 1);
    pre_tokenizer_.add(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), path_);
    if (!pre_tokenizer_.byte_level())
      ZEROTH_THROW(InvalidArgument, "{}: the pre-tokenizer has no ByteLevel step: not a byte-level BPE", path_);
    const json decoder = j.contains("decoder") ? j["decoder"] : json();
    if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
      ZEROTH_THROW(InvalidArgument, "{}: the decoder is {}; a byte-level BPE tokenizer decodes with ByteLevel", path_, decoder.dump());
    }
  }

  void put_token(int32_t id, const std::string& token) {
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(id + 1), has_token_.resize(id + 1);
    tokens_[id] = token;
    has_token_[id] = true;
  }

  void load_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = n.value("type", "");
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence") {
      for (const json& m : n.at("normalizers")) load_normalizer(m);
    } else {
      ZEROTH_THROW(InvalidArgument, "{}: the normalizer {} is not one zeroth applies (NFC, or none)", path_, n.dump());
    }
  }

  std::string normalize(std::string_view s) const {
    if (!nfc_ || s.empty()) return std::string(s);
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                                static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) ZEROTH_THROW(InvalidArgument, "{}: utf8proc_map (NFC) of {} bytes: {}", path_, s.size(), utf8proc_errmsg(n));
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

  // The code point that begins at byte `at`, and the one that ends just before it (valid UTF-8).
  static int32_t code_point_at(std::string_view s, size_t at) {
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + at), static_cast<utf8proc_ssize_t>(s.size() - at), &cp);
    return cp;
  }
  static size_t char_begin_before(std::string_view s, size_t at) {
    size_t b = at - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    return b;
  }
  // Unicode's White_Space, what Rust's char::is_whitespace (lstrip, rstrip) tests.
  static bool is_space(int32_t cp) {
    const auto cat = utf8proc_category(cp);
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
  }
  // A word character as Rust's regex \w has it (single_word): letters, marks, decimal and letter
  // numbers, connector punctuation, the joiners.
  static bool is_word(int32_t cp) {
    switch (utf8proc_category(cp)) {
      case UTF8PROC_CATEGORY_LU:
      case UTF8PROC_CATEGORY_LL:
      case UTF8PROC_CATEGORY_LT:
      case UTF8PROC_CATEGORY_LM:
      case UTF8PROC_CATEGORY_LO:
      case UTF8PROC_CATEGORY_MN:
      case UTF8PROC_CATEGORY_MC:
      case UTF8PROC_CATEGORY_ME:
      case UTF8PROC_CATEGORY_ND:
      case UTF8PROC_CATEGORY_NL:
      case UTF8PROC_CATEGORY_PC: return true;
      default: return cp == 0x200C || cp == 0x200D;
    }
  }

  // Calls `gap` on each stretch of `s` between the added tokens of the given kind (normalized or
  // not), and `emit(id, end)` for each token in between (`end` where it ends in `s`): leftmost
  // first, the longest where several begin at one place; lstrip/rstrip take the whitespace beside
  // a token into it.
  template <typename E, typename F>
  void split_added(std::string_view s, bool normalized, E&& emit, F&& gap) const {
    std::vector<size_t> next(added_.size(), std::string_view::npos);
    auto find = [&](size_t k, size_t from) {
      const Added& a = added_[k];
      size_t at = s.find(a.match, from);
      // A single-word token must not touch a word character on either side.
      while (at != std::string_view::npos && a.single_word &&
             ((at > 0 && is_word(code_point_at(s, char_begin_before(s, at)))) ||
              (at + a.match.size() < s.size() && is_word(code_point_at(s, at + a.match.size()))))) {
        at = s.find(a.match, at + 1);
      }
      next[k] = at;
    };
    bool any = false;
    for (size_t k = 0; k < added_.size(); ++k) {
      if (added_[k].normalized == normalized) find(k, 0), any = true;
    }
    size_t pos = 0;
    while (any) {
      size_t best = added_.size();
      for (size_t k = 0; k < added_.size(); ++k) {
        if (added_[k].normalized != normalized || next[k] == std::string_view::npos) continue;
        if (best == added_.size() || next[k] < next[best] ||
            (next[k] == next[best] && added_[k].match.size() > added_[best].match.size()))
          best = k;
      }
      if (best == added_.size()) break;
      const Added& a = added_[best];
      size_t begin = next[best], end = begin + a.match.size();
      if (a.lstrip)
        while (begin > pos && is_space(code_point_at(s, char_begin_before(s, begin)))) begin = char_begin_before(s, begin);
      if (a.rstrip) {
        while (end < s.size() && is_space(code_point_at(s, end))) {
          utf8proc_int32_t cp = 0;
          end += static_cast<size_t>(utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + end),
                                                      static_cast<utf8proc_ssize_t>(s.size() - end), &cp));
        }
      }
      if (begin > pos) gap(s.substr(pos, begin - pos));
      emit(a.id, s.data() + end);
      pos = end;
      for (size_t k = 0; k < added_.size(); ++k) {
        if (added_[k].normalized == normalized && next[k] != std::string_view::npos && next[k] < pos) find(k, pos);
      }
    }
    if (pos < s.size()) gap(s.substr(pos));
  }

  static uint64_t pair_key(int32_t a, int32_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }

  // One pre-tokenized piece's ids: its bytes' tokens, merged lowest rank first (leftmost of equal
  // ranks) until no adjacent pair has a merge, through a heap over a linked list as Hugging Face's
  // BPE does, so a long piece (a run of spaces, a base64 blob) costs n log n; with ignore_merges, a
  // piece in the vocabulary whole is that token.
  struct Merged {
    std::vector<int32_t> ids;
    std::vector<uint32_t> ends;  // each token's end in the piece
  };
  Merged merge(std::string_view piece) const {
    if (ignore_merges_) {
      std::string mapped;
      for (const char c : piece) mapped += byte_chars_[static_cast<unsigned char>(c)];
      if (const auto it = vocab_.find(mapped); it != vocab_.end()) return {{it->second}, {static_cast<uint32_t>(piece.size())}};
    }
    const int n = static_cast<int>(piece.size());
    struct Symbol {
      int32_t id;      // -1 once merged into the symbol before it
      int prev, next;  // -1 at the ends
    };
    std::vector<Symbol> sym(n);
    for (int i = 0; i < n; ++i) sym[i] = {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
    struct Candidate {
      int32_t rank;
      int pos;
      int32_t left, right, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto consider = [&](int i) {
      if (i < 0 || sym[i].next < 0) return;
      const auto it = merges_.find(pair_key(sym[i].id, sym[sym[i].next].id));
      if (it != merges_.end()) heap.push({it->second.rank, i, sym[i].id, sym[sym[i].next].id, it->second.id});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const int j = sym[c.pos].next;
      if (sym[c.pos].id != c.left || j < 0 || sym[j].id != c.right) continue;  // stale: a side merged since
      sym[c.pos].id = c.merged;
      sym[c.pos].next = sym[j].next;
      if (sym[j].next >= 0) sym[sym[j].next].prev = c.pos;
      sym[j].id = -1;
      consider(sym[c.pos].prev);
      consider(c.pos);
    }
    Merged m;
    for (int i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) {
      m.ids.push_back(sym[i].id);
      m.ends.push_back(static_cast<uint32_t>(sym[i].next >= 0 ? sym[i].next : n));  // a symbol spans up to the next one's start
    }
    return m;
  }

  std::string path_;
  uint64_t fingerprint_ = 0;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id: the vocabulary's and the added tokens'
  std::vector<bool> has_token_;
  std::unordered_map<std::string, unsigned char> char_to_byte_;
  std::array<std::string, 256> byte_chars_ = byte_chars();
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::vector<Added> added_;
  bool nfc_ = false;
  PreTokenizer pre_tokenizer_;
};

}  // namespace

std::unique_ptr<Tokenizer> open_byte_level_bpe(const std::string& path) { return std::make_unique<ByteLevelBpe>(path); }

}  // namespace zeroth
