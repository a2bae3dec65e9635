// The template split into text and tags, with Jinja's whitespace rules as Hugging Face renders chat
// templates: trim_blocks (the newline after a block tag goes), lstrip_blocks (the spaces before a
// block tag at the start of its line go), `-` on either side of a tag, and keep_trailing_newline off.
#include <cctype>  // std::isalpha, std::isdigit, std::isalnum

#include "core/error.h"  // ZEROTH_THROW
#include "train/text/jinja/syntax.h"

namespace zeroth::jinja {
namespace {

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& where) : where_(where) {
    // Jinja reads \r\n and \r as \n (its newline_sequence).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    // keep_trailing_newline is off: one newline at the very end is not part of the output.
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Piece> run() {
    size_t text_start = 0;
    bool trim_next = false, strip_next = false;  // what the previous tag asks of the text after it
    bool text_at_line_start = true;
    while (true) {
      const size_t open = next_tag(text_start);
      std::string text = src_.substr(text_start, open == std::string::npos ? std::string::npos : open - text_start);
      const int text_line = line_;
      count_lines(text);
      if (open == std::string::npos) {
        push_text(finish_text(text, trim_next, strip_next, false, false, text_at_line_start), text_line);
        return std::move(pieces_);
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t at = open + 2;
      char open_mod = 0;
      if (at < src_.size() && (src_[at] == '-' || src_[at] == '+')) open_mod = src_[at++];
      const bool block = kind != '{';
      const bool lstrip = block && open_mod != '+';
      push_text(finish_text(text, trim_next, strip_next, open_mod == '-', lstrip, text_at_line_start), text_line);
      Piece tag;
      tag.line = line_;
      char close_mod = 0;
      if (kind == '#') {
        const size_t end = src_.find("#}", at);
        if (end == std::string::npos) fail(tag.line, "a comment {# that is never closed with #}");
        if (end > at && src_[end - 1] == '-') close_mod = '-';
        count_lines(src_.substr(at, end - at));
        text_start = end + 2;
      } else {
        tag.kind = kind == '{' ? Piece::Kind::output : Piece::Kind::statement;
        text_start = lex_tag(tag, at, kind == '{' ? '}' : '%', close_mod);
        pieces_.push_back(std::move(tag));
      }
      strip_next = close_mod == '-';
      trim_next = block && close_mod != '+' && close_mod != '-';
      text_at_line_start = false;
    }
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t at = src_.find('{', from); at != std::string::npos; at = src_.find('{', at + 1))
      if (at + 1 < src_.size() && (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')) return at;
    return std::string::npos;
  }

  void count_lines(const std::string& s) {
    for (char c : s) line_ += c == '\n';
  }

  // The text between two tags, as the tags' whitespace rules leave it.
  static std::string finish_text(std::string text, bool trim_first_newline, bool strip_front, bool strip_back, bool lstrip_block,
                                 bool at_source_start) {
    if (lstrip_block && !strip_back) {
      // Spaces and tabs between the line's start and the block tag.
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      bool blank = true;
      for (size_t i = from; i < text.size(); ++i) blank = blank && (text[i] == ' ' || text[i] == '\t');
      if (blank && (nl != std::string::npos || at_source_start)) text.erase(from);
    }
    if (strip_front) {
      size_t i = 0;
      for (size_t n; (n = space_at(text, i)) > 0;) i += n;
      text.erase(0, i);
    } else if (trim_first_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    if (strip_back) {
      for (size_t n; (n = space_before(text, text.size())) > 0;) text.resize(text.size() - n);
    }
    return text;
  }

  void push_text(std::string text, int line) {
    if (text.empty()) return;
    Piece p;
    p.kind = Piece::Kind::text;
    p.text = std::move(text);
    p.line = line;
    pieces_.push_back(std::move(p));
  }

  // Tokens from `at` to the tag's end (`close` then '}'), brackets balanced; returns where the text
  // after the tag starts.
  size_t lex_tag(Piece& tag, size_t at, char close, char& close_mod) {
    int depth = 0;
    while (true) {
      while (at < src_.size() && is_space(src_[at])) line_ += src_[at++] == '\n';
      if (at >= src_.size()) fail(tag.line, close == '}' ? "a {{ that is never closed with }}" : "a {% that is never closed with %}");
      const char c = src_[at];
      if (depth == 0) {
        for (char mod : {'-', '+'}) {
          if (c == mod && at + 2 < src_.size() && src_[at + 1] == close && src_[at + 2] == '}') {
            close_mod = mod;
            return at + 3;
          }
        }
        if (c == close && at + 1 < src_.size() && src_[at + 1] == '}') return at + 2;
      }
      Token t;
      t.line = line_;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = at;
        while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
        t.kind = Token::Kind::name;
        t.text = src_.substr(at, end - at);
        at = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t end = at;
        while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
        t.kind = Token::Kind::integer;
        if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
          ++end;
          while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
          t.kind = Token::Kind::floating;
        }
        if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
          size_t e = end + 1;
          if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
          if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
            end = e;
            t.kind = Token::Kind::floating;
          }
        }
        for (size_t i = at; i < end; ++i)
          if (src_[i] != '_') t.text += src_[i];
        at = end;
      } else if (c == '\'' || c == '"') {
        t.kind = Token::Kind::string;
        at = lex_string(t, at + 1, c);
      } else {
        t.kind = Token::Kind::op;
        static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
        t.text = std::string(1, c);
        for (const char* op : two)
          if (src_.compare(at, 2, op) == 0) t.text = op;
        if (t.text.size() == 1 && std::string("+-*/%~<>=()[]{}.,:|").find(c) == std::string::npos)
          fail(line_, "the character '" + t.text + "' where an expression was expected");
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        at += t.text.size();
      }
      tag.tokens.push_back(std::move(t));
    }
  }

  size_t lex_string(Token& t, size_t at, char quote) {
    while (at < src_.size() && src_[at] != quote) {
      char c = src_[at++];
      if (c == '\n') ++line_;
      if (c == '\\' && at < src_.size()) {
        const char e = src_[at++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case '\\': c = '\\'; break;
          case '\'': c = '\''; break;
          case '"': c = '"'; break;
          case '0': c = '\0'; break;
          default: t.text += '\\'; c = e;
        }
      }
      t.text += c;
    }
    if (at >= src_.size()) fail(t.line, "a string that is never closed");
    return at + 1;
  }

  [[noreturn]] void fail(int line, const std::string& what) const {
    ZEROTH_THROW(InvalidArgument, "{}, line {}: {}", where_, line, what);
  }

  std::string src_;
  const std::string& where_;
  int line_ = 1;
  std::vector<Piece> pieces_;
};

}  // namespace

std::vector<Piece> split_template(const std::string& source, const std::string& where) { return Lexer(source, where).run(); }

}  // namespace zeroth::jinja
