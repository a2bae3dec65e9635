// The tags' tokens as a tree, with Jinja's precedence: conditional, or, and, not, comparison
// (in, not in), + -, ~, * / // %, **, unary - +, then a primary's attributes, subscripts and calls,
// and its filters (|) and tests (is) after it.
#include <set>  // std::set

#include "core/error.h"  // ZEROTH_THROW
#include "train/text/jinja/syntax.h"

namespace zeroth::jinja {
namespace {

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, const std::string& where, int line) : t_(tokens), where_(where), line_(line) {}

  bool done() const { return at_ >= t_.size(); }
  const Token& peek(size_t ahead = 0) const {
    static const Token end;
    return at_ + ahead < t_.size() ? t_[at_ + ahead] : end;
  }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::op && peek(ahead).text == op; }
  bool is_name(const char* name, size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::name && peek(ahead).text == name; }
  Token take() {
    if (done()) fail("the tag ends where more was expected");
    return t_[at_++];
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(peek()));
    ++at_;
  }
  std::string take_name(const char* what) {
    if (peek().kind != Token::Kind::name) fail(std::string("expected ") + what + ", got " + describe(peek()));
    return t_[at_++].text;
  }
  void expect_end() {
    if (!done()) fail("unexpected " + describe(peek()));
  }
  int line() const { return done() ? line_ : peek().line; }

  ExprPtr expression() {
    ExprPtr e = or_expr();
    if (is_name("if")) {
      ++at_;
      auto c = make(Expr::Kind::cond);
      c->args.push_back(or_expr());  // the test
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        ++at_;
        c->args.push_back(expression());
      }
      return c;
    }
    return e;
  }
  // Without the conditional: a for loop's iterable, where `if` starts the loop's filter.
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      ++at_;
      e = binary(Expr::Kind::or_, "or", std::move(e), and_expr());
    }
    return e;
  }

  [[noreturn]] void fail(const std::string& what) const { ZEROTH_THROW(InvalidArgument, "{}, line {}: {}", where_, line(), what); }

 private:
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::end: return "the end of the tag";
      case Token::Kind::string: return "the string '" + t.text + "'";
      default: return "'" + t.text + "'";
    }
  }
  ExprPtr make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line();
    return e;
  }
  ExprPtr binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(kind);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      ++at_;
      e = binary(Expr::Kind::and_, "and", std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      ++at_;
      auto e = make(Expr::Kind::not_);
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr first = sum();
    ExprPtr e;
    while (true) {
      std::string op;
      if (peek().kind == Token::Kind::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
                                             peek().text == "<=" || peek().text == ">=")) {
        op = take().text;
      } else if (is_name("in")) {
        ++at_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        at_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!e) {
        e = make(Expr::Kind::compare);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->args.push_back(sum());
    }
    return e ? std::move(e) : std::move(first);
  }
  ExprPtr sum() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = take().text;
      e = binary(Expr::Kind::binary, op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = product();
    while (is_op("~")) {
      ++at_;
      e = binary(Expr::Kind::binary, "~", std::move(e), product());
    }
    return e;
  }
  ExprPtr product() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = take().text;
      e = binary(Expr::Kind::binary, op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      ++at_;
      e = binary(Expr::Kind::binary, "**", std::move(e), unary(true));
    }
    return e;
  }
  ExprPtr unary(bool with_filters) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = make(Expr::Kind::unary);
      u->name = take().text;
      u->args.push_back(unary(false));
      e = std::move(u);
    } else {
      e = postfix(primary());
    }
    return with_filters ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token t = take();
    auto e = make(Expr::Kind::literal);
    e->line = t.line;
    switch (t.kind) {
      case Token::Kind::string: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::string) s += take().text;  // adjacent strings join
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::integer: e->literal = Value::integer(std::stoll(t.text)); return e;
      case Token::Kind::floating: e->literal = Value::floating(std::stod(t.text)); return e;
      case Token::Kind::name:
        if (t.text == "true" || t.text == "True") e->literal = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
        }
        return e;
      case Token::Kind::op:
        if (t.text == "(") {
          ExprPtr inner = expression();
          if (is_op(",")) {  // a tuple
            auto list = make(Expr::Kind::list);
            list->name = "tuple";
            list->args.push_back(std::move(inner));
            while (is_op(",")) {
              ++at_;
              if (is_op(")")) break;
              list->args.push_back(expression());
            }
            inner = std::move(list);
          }
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          e->kind = Expr::Kind::list;
          while (!is_op("]")) {
            e->args.push_back(expression());
            if (!is_op("]")) expect_op(",");
          }
          ++at_;
          return e;
        }
        if (t.text == "{") {
          e->kind = Expr::Kind::dict;
          while (!is_op("}")) {
            e->args.push_back(expression());
            expect_op(":");
            e->args.push_back(expression());
            if (!is_op("}")) expect_op(",");
          }
          ++at_;
          return e;
        }
        break;
      default: break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        ++at_;
        auto a = make(Expr::Kind::attr);
        a->name = peek().kind == Token::Kind::integer ? take().text : take_name("an attribute name");
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++at_;
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprPtr subscript(ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = expression();
      if (is_op(":") && k < 2) {
        ++at_;
        ++colons;
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make(colons > 0 ? Expr::Kind::slice : Expr::Kind::item);
    e->args.push_back(std::move(obj));
    if (colons == 0) {
      if (!parts[0]) fail("an empty subscript []");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->args.push_back(std::move(p));  // null where left out
    }
    return e;
  }
  // `callee(args)`: the callee first, then positional arguments, and keyword ones apart.
  ExprPtr call(ExprPtr callee) {
    auto e = make(Expr::Kind::call);
    e->args.push_back(std::move(callee));
    arguments(*e);
    return e;
  }
  void arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::name && is_op("=", 1)) {
        std::string key = take().text;
        ++at_;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument after a keyword one");
        e.args.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++at_;
  }
  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        ++at_;
        auto f = make(Expr::Kind::filter);
        f->name = take_name("a filter name");
        f->args.push_back(std::move(e));
        if (is_op("(")) arguments(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++at_;
        auto t = make(Expr::Kind::test);
        if (is_name("not")) {
          ++at_;
          t->negated = true;
        }
        t->name = take_name("a test name");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          arguments(*t);
        } else if (starts_argument()) {
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }
  bool starts_argument() const {
    const Token& t = peek();
    if (t.kind == Token::Kind::string || t.kind == Token::Kind::integer || t.kind == Token::Kind::floating) return true;
    if (t.kind == Token::Kind::op) return t.text == "[" || t.text == "{";
    static const std::set<std::string> stops = {"else", "or", "and", "if", "is", "in", "not"};
    return t.kind == Token::Kind::name && !stops.contains(t.text);
  }

  const std::vector<Token>& t_;
  const std::string& where_;
  int line_;
  size_t at_ = 0;
};

class TemplateParser {
 public:
  TemplateParser(const std::vector<Piece>& pieces, const std::string& where) : p_(pieces), where_(where) {}

  std::vector<Node> run() {
    std::string end;
    auto nodes = block({}, end);
    return nodes;
  }

 private:
  // Nodes up to one of `ends` (its keyword goes to `end`; none at the template's end).
  std::vector<Node> block(const std::set<std::string>& ends, std::string& end) {
    std::vector<Node> nodes;
    while (at_ < p_.size()) {
      const Piece& piece = p_[at_++];
      Node n;
      n.line = piece.line;
      if (piece.kind == Piece::Kind::text) {
        n.kind = Node::Kind::text;
        n.text = piece.text;
        nodes.push_back(std::move(n));
        continue;
      }
      ExprParser x(piece.tokens, where_, piece.line);
      if (piece.kind == Piece::Kind::output) {
        n.kind = Node::Kind::output;
        n.expr = x.expression();
        x.expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      const std::string word = x.take_name("a statement");
      if (ends.contains(word)) {
        end = word;
        last_ = &piece;
        return nodes;
      }
      statement(word, x, n);
      nodes.push_back(std::move(n));
    }
    if (!ends.empty()) {
      ZEROTH_THROW(InvalidArgument, "{}: the template ends inside a block; expected {{% {} %}}", where_, *ends.rbegin());
    }
    return nodes;
  }

  void statement(const std::string& word, ExprParser& x, Node& n) {
    std::string end;
    if (word == "if") {
      n.kind = Node::Kind::if_;
      ExprPtr cond = x.expression();
      x.expect_end();
      while (true) {
        auto body = block({"elif", "else", "endif"}, end);
        n.branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          ExprParser c(last_->tokens, where_, last_->line);
          c.take();
          cond = c.expression();
          c.expect_end();
          continue;
        }
        if (end == "else") n.else_body = block({"endif"}, end);
        return;
      }
    }
    if (word == "for") {
      n.kind = Node::Kind::for_;
      n.targets.push_back(x.take_name("a loop variable"));
      while (x.is_op(",")) {
        x.take();
        n.targets.push_back(x.take_name("a loop variable"));
      }
      if (!x.is_name("in")) x.fail("expected 'in' after the loop's variables");
      x.take();
      n.expr = x.or_expr();
      if (x.is_name("if")) {
        x.take();
        n.filter = x.expression();
      }
      if (x.is_name("recursive")) x.fail("recursive loops are outside the chat-template subset");
      x.expect_end();
      n.body = block({"else", "endfor"}, end);
      if (end == "else") n.else_body = block({"endfor"}, end);
      return;
    }
    if (word == "set") {
      n.kind = Node::Kind::set;
      n.targets.push_back(x.take_name("a variable to set"));
      if (x.is_op(".")) {
        x.take();
        n.targets.push_back(x.take_name("an attribute to set"));
      }
      if (x.is_op(",")) x.fail("setting several variables at once is outside the chat-template subset");
      if (!x.is_op("=")) x.fail("a block {% set %} ... {% endset %} is outside the chat-template subset; use {% set name = value %}");
      x.take();
      n.expr = x.expression();
      x.expect_end();
      return;
    }
    if (word == "macro") {
      n.kind = Node::Kind::macro;
      n.targets.push_back(x.take_name("a macro name"));
      x.expect_op("(");
      while (!x.is_op(")")) {
        n.params.push_back(x.take_name("a parameter"));
        if (x.is_op("=")) {
          x.take();
          n.defaults.push_back(x.expression());
        } else {
          n.defaults.push_back(nullptr);
        }
        if (!x.is_op(")")) x.expect_op(",");
      }
      x.take();
      x.expect_end();
      n.body = block({"endmacro"}, end);
      return;
    }
    if (word == "generation") {
      n.kind = Node::Kind::generation;
      x.expect_end();
      n.body = block({"endgeneration"}, end);
      return;
    }
    if (word == "break" || word == "continue") {
      n.kind = word == "break" ? Node::Kind::break_ : Node::Kind::continue_;
      x.expect_end();
      return;
    }
    if (word.rfind("end", 0) == 0 || word == "elif" || word == "else") x.fail("{% " + word + " %} with no open block it could close");
    x.fail("the tag {% " + word + " %} is outside the chat-template subset (if, for, set, macro, generation, break, continue)");
  }

  const std::vector<Piece>& p_;
  const std::string& where_;
  size_t at_ = 0;
  const Piece* last_ = nullptr;
};

}  // namespace

std::vector<Node> parse_template(const std::vector<Piece>& pieces, const std::string& where) {
  return TemplateParser(pieces, where).run();
}

}  // namespace zeroth::jinja
