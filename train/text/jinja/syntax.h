// A chat template's syntax: the template split into text and tags (with Jinja's whitespace rules as
// Hugging Face sets them: trim_blocks and lstrip_blocks), each tag's tokens, and the tree the parser
// builds of them. Every construct outside the subset the published chat templates use is an error
// that names it and its line.
#pragma once

#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "train/text/jinja/value.h"

namespace zeroth::jinja {

struct Token {
  enum class Kind { name, integer, floating, string, op, end };
  Kind kind = Kind::end;
  std::string text;  // a name, an operator, a string's value, a number's digits
  int line = 0;
};

// A piece of the template: text to copy, or a tag's tokens.
struct Piece {
  enum class Kind { text, output, statement };
  Kind kind = Kind::text;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

// `where` names the template in errors ("tokenizer_config.json's chat_template").
std::vector<Piece> split_template(const std::string& source, const std::string& where);

struct Expr {
  enum class Kind { literal, name, attr, item, slice, call, filter, test, unary, binary, compare, and_, or_, not_, cond, list, dict };
  Kind kind = Kind::literal;
  int line = 0;
  Value literal;
  std::string name;                         // a name, an attribute, a filter or test, an operator
  std::vector<std::unique_ptr<Expr>> args;  // operands, positional arguments, items (a dict's as key, value)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;  // a comparison's operators, one between each two operands
  bool negated = false;          // `is not`
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  enum class Kind { text, output, if_, for_, set, macro, generation, break_, continue_ };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;
  ExprPtr expr;                                                 // output, set's value, for's iterable
  std::vector<std::string> targets;                             // for's targets; set's name (and attribute); a macro's name
  ExprPtr filter;                                               // for ... if filter
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if and elif
  std::vector<Node> body, else_body;
  std::vector<std::string> params;  // a macro's
  std::vector<ExprPtr> defaults;    // per parameter, or null
};

std::vector<Node> parse_template(const std::vector<Piece>& pieces, const std::string& where);

}  // namespace zeroth::jinja
