// The pre-tokenizer of a Hugging Face tokenizer.json, as its library runs it: Split steps (a
// pattern in Oniguruma's syntax, which PCRE2 reads with its Unicode classes, or a literal string;
// one of Hugging Face's five behaviours) and the ByteLevel that ends them (a space put before a
// piece that lacks one; GPT-2's pattern), each step cutting every piece the steps before it left.
#pragma once

#include <functional>   // std::function
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace zeroth {

class PreTokenizer {
 public:
  // `origin`: where the piece begins in the text given to for_each_piece; `inserted`: its first
  // byte is a space the pre-tokenizer put there (add_prefix_space), not the text's.
  using Emit = std::function<void(std::string_view piece, size_t origin, bool inserted)>;

  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Appends the steps of a tokenizer.json's "pre_tokenizer" (Split, ByteLevel, a Sequence of them).
  // InvalidArgument naming `where` for another kind, a step after ByteLevel, a pattern PCRE2
  // refuses.
  void add(const nlohmann::json& config, const std::string& where);
  bool byte_level() const { return byte_level_; }
  // Each piece of `text` in order, each one stretch of it (or of it with a space put before); the
  // steps nest, so no list of a whole text's pieces is ever held.
  void for_each_piece(std::string_view text, const Emit& emit) const;

 private:
  struct Step;
  void run(std::string_view text, size_t step, size_t origin, bool inserted, const Emit& emit) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace zeroth
