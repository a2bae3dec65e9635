// The pre-tokenizer of a Hugging Face tokenizer.json (train/text/pre_tokenizer.h).
#include "train/text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>  // pcre2_compile, pcre2_match

#include <memory>  // std::unique_ptr, std::make_unique

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
// Named, not anonymous: PreTokenizer::Step holds a Regex, and a unity build compiles this file as
// an included one, where a member of an anonymous namespace's type is a warning.
namespace pre_tokenizer_parts {

// GPT-2's pre-tokenizer pattern, which ByteLevel applies when its use_regex is set.
constexpr std::string_view kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled pattern; its matches over a text, in order.
class Regex {
 public:
  Regex(std::string_view pattern, bool literal, const std::string& where) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    // PCRE2_LITERAL takes no Unicode-property option (a literal has no classes to widen).
    const uint32_t options = literal ? PCRE2_LITERAL | PCRE2_UTF : PCRE2_UTF | PCRE2_UCP;
    re_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &code, &offset, nullptr);
    if (re_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(code, message, sizeof message);
      ZEROTH_THROW(InvalidArgument, "{}: pcre2_compile of the pattern \"{}\": {} at offset {}", where, pattern,
                   reinterpret_cast<const char*>(message), offset);
    }
    pcre2_jit_compile(re_, PCRE2_JIT_COMPLETE);  // where JIT is unavailable, the interpreter runs it
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(re_); }

  // [begin, end) of each non-empty match of `text` (valid UTF-8).
  template <typename F>
  void for_each_match(std::string_view text, F&& f) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create_from_pattern(re_, nullptr),
                                                                           &pcre2_match_data_free);
    size_t at = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(re_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, PCRE2_NO_UTF_CHECK, md.get(),
                                 nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        ZEROTH_THROW(InvalidArgument, "pcre2_match at byte {} of a {}-byte text: {}", at, text.size(),
                     reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(md.get());
      if (v[1] > v[0]) {
        f(v[0], v[1]);
        at = v[1];
      } else {  // an empty match: on to the next character
        at = v[0] + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      }
    }
  }

 private:
  pcre2_code* re_ = nullptr;
};

enum class Behavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

// Hugging Face's five ways of cutting a text at a pattern's matches (on "the-final--countdown"
// at "-": isolated the,-,final,-,-,countdown; removed the,final,countdown; merged with previous
// the-,final-,-,countdown; merged with next the,-final,-,-countdown; contiguous
// the,-,final,--,countdown). Each piece is one stretch of the text.
template <typename F>
void split(const Regex& re, Behavior behavior, std::string_view s, F&& emit) {
  using B = Behavior;
  constexpr size_t none = std::string_view::npos;
  size_t pos = 0;                    // the end of what is cut so far
  size_t held = none, held_end = 0;  // merged with next: the match waiting for what follows
  size_t run = none, run_end = 0;    // contiguous: the run of matches so far
  re.for_each_match(s, [&](size_t b, size_t e) {
    const bool gap = b > pos;
    switch (behavior) {
      case B::isolated:
        if (gap) emit(s.substr(pos, b - pos));
        emit(s.substr(b, e - b));
        break;
      case B::removed:
        if (gap) emit(s.substr(pos, b - pos));
        break;
      case B::merged_with_previous: emit(s.substr(gap ? pos : b, e - (gap ? pos : b))); break;
      case B::merged_with_next: {
        const size_t from = held != none ? held : pos;
        if (gap) {
          emit(s.substr(from, b - from));
        } else if (held != none) {
          emit(s.substr(held, held_end - held));
        }
        held = b, held_end = e;
        break;
      }
      case B::contiguous:
        if (gap) {
          if (run != none) emit(s.substr(run, run_end - run));
          emit(s.substr(pos, b - pos));
          run = none;
        }
        if (run == none) run = b;
        run_end = e;
        break;
    }
    pos = e;
  });
  if (held != none) {
    emit(s.substr(held));  // the waiting match and whatever follows it
    return;
  }
  if (run != none) emit(s.substr(run, run_end - run));
  if (pos < s.size()) emit(s.substr(pos));
}

}  // namespace pre_tokenizer_parts

using pre_tokenizer_parts::Behavior;
using pre_tokenizer_parts::kGpt2Pattern;
using pre_tokenizer_parts::Regex;
using pre_tokenizer_parts::split;

// One step, on each piece the steps before it left: a Split, or the ByteLevel that ends them (a
// space put before a piece that lacks one, GPT-2's pattern).
struct PreTokenizer::Step {
  std::unique_ptr<Regex> regex;  // none: a ByteLevel without use_regex
  Behavior behavior = Behavior::isolated;
  bool prefix_space = false;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::add(const nlohmann::json& p, const std::string& where) {
  const std::string type = p.is_object() ? p.value("type", "") : "";
  if (type == "Sequence") {
    for (const nlohmann::json& s : p.at("pretokenizers")) add(s, where);
    return;
  }
  if (byte_level_) {
    ZEROTH_THROW(InvalidArgument, "{}: the pre-tokenizer {} follows ByteLevel; zeroth applies ByteLevel last, as Llama 3 and Qwen do",
                 where, p.dump());
  }
  if (type == "ByteLevel") {
    byte_level_ = true;
    steps_.push_back({p.value("use_regex", true) ? std::make_unique<Regex>(kGpt2Pattern, false, where + ": GPT-2's pattern") : nullptr,
                      Behavior::isolated, p.value("add_prefix_space", false)});
  } else if (type == "Split") {
    if (p.value("invert", false)) ZEROTH_THROW(InvalidArgument, "{}: a Split with invert set: zeroth splits on matches only", where);
    const nlohmann::json& pattern = p.at("pattern");
    const bool literal = pattern.contains("String");
    const std::string text = literal ? pattern["String"] : pattern.at("Regex");
    const std::string behavior = p.at("behavior");
    using B = Behavior;
    B b = B::isolated;
    if (behavior == "Removed") {
      b = B::removed;
    } else if (behavior == "MergedWithPrevious") {
      b = B::merged_with_previous;
    } else if (behavior == "MergedWithNext") {
      b = B::merged_with_next;
    } else if (behavior == "Contiguous") {
      b = B::contiguous;
    } else if (behavior != "Isolated") {
      ZEROTH_THROW(InvalidArgument,
                   "{}: a Split's behavior is \"{}\", none of Hugging Face's five (Isolated, Removed, MergedWithPrevious, "
                   "MergedWithNext, Contiguous)",
                   where, behavior);
    }
    steps_.push_back({std::make_unique<Regex>(text, literal, where + ": pre_tokenizer Split"), b, false});
  } else {
    ZEROTH_THROW(InvalidArgument,
                 "{}: the pre-tokenizer {} is not one zeroth applies (Split, ByteLevel, a Sequence of them: GPT-2's, Llama 3's, "
                 "Qwen's)",
                 where, p.dump());
  }
}

void PreTokenizer::for_each_piece(std::string_view text, const Emit& emit) const { run(text, 0, 0, false, emit); }

// The pieces of `text` after steps [step, end), in order; `text` begins at `origin` of the whole
// text, with a space put before it when `inserted`.
void PreTokenizer::run(std::string_view text, size_t step, size_t origin, bool inserted, const Emit& emit) const {
  if (step == steps_.size()) {
    if (!text.empty()) emit(text, origin, inserted);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.prefix_space && (text.empty() || text[0] != ' ')) {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
    inserted = true;
  }
  if (!s.regex) {
    run(text, step + 1, origin, inserted, emit);
    return;
  }
  split(*s.regex, s.behavior, text, [&](std::string_view piece) {
    const size_t j = static_cast<size_t>(piece.data() - text.data());
    run(piece, step + 1, origin + (inserted && j > 0 ? j - 1 : j), inserted && j == 0, emit);
  });
}

}  // namespace zeroth
