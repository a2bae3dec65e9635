// The renderer: the template's nodes walked over scopes as Jinja's compiled code walks them. A for
// loop's body has a scope of its own (what it sets is gone after the loop: templates use
// namespace() to carry a value out), `if` has none, and a macro sees its arguments and the
// template's top-level names.
#include "train/text/jinja/template.h"

#include "core/error.h"  // ZEROTH_THROW
#include "train/text/jinja/builtins.h"
#include "train/text/jinja/syntax.h"

namespace zeroth::jinja {

struct MacroDef {
  const Node* node;
};

namespace {

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { next, break_, continue_ };

// The marks a {% generation %} block's output carries until the render ends (Renderer::run), as
// the reference (tests/reference/jinja_render.py) brackets it.
constexpr char kGenerationOpen = '\x02', kGenerationClose = '\x03';

class Renderer {
 public:
  Renderer(const std::string& where, Scope& globals) : where_(where), globals_(globals) {}

  Rendered run(const std::vector<Node>& nodes) {
    Rendered r;
    out_ = &r.text;
    const Flow f = nodes_(nodes, globals_);
    if (f != Flow::next) Site{where_, 0}.fail("{% break %} or {% continue %} outside a loop");
    // A generation block's output is bracketed by two marks wherever it goes (into a macro's
    // returned string too, which may then be placed anywhere): taken out here, their places are
    // the spans.
    std::string text;
    text.reserve(r.text.size());
    size_t start = 0;
    for (char c : r.text) {
      if (c == kGenerationOpen) {
        start = text.size();
      } else if (c == kGenerationClose) {
        r.generation.emplace_back(start, text.size());
      } else {
        text += c;
      }
    }
    r.text = std::move(text);
    return r;
  }

 private:
  Flow nodes_(const std::vector<Node>& nodes, Scope& scope) {
    for (const Node& n : nodes) {
      const Flow f = node(n, scope);
      if (f != Flow::next) return f;
    }
    return Flow::next;
  }

  Flow node(const Node& n, Scope& scope) {
    const Site site{where_, n.line};
    switch (n.kind) {
      case Node::Kind::text: *out_ += n.text; return Flow::next;
      case Node::Kind::output: *out_ += to_output(eval(*n.expr, scope)); return Flow::next;
      case Node::Kind::if_:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond, scope))) return nodes_(body, scope);
        return nodes_(n.else_body, scope);
      case Node::Kind::for_: return loop(n, scope);
      case Node::Kind::set: {
        Value v = eval(*n.expr, scope);
        if (n.targets.size() == 1) {
          scope.set(n.targets[0], std::move(v));
          return Flow::next;
        }
        const Value* ns = scope.find(n.targets[0]);
        if (ns == nullptr || !ns->is(Value::Kind::ns))
          site.fail("cannot set an attribute of " + n.targets[0] + ": only a namespace() takes one");
        for (auto& [k, old] : *ns->dict) {
          if (k == n.targets[1]) {
            old = std::move(v);
            return Flow::next;
          }
        }
        ns->dict->emplace_back(n.targets[1], std::move(v));
        return Flow::next;
      }
      case Node::Kind::macro: {
        Value m;
        m.kind = Value::Kind::macro;
        m.macro = std::make_shared<const MacroDef>(MacroDef{&n});
        scope.set(n.targets[0], std::move(m));
        return Flow::next;
      }
      case Node::Kind::generation: {
        *out_ += kGenerationOpen;
        const Flow f = nodes_(n.body, scope);
        *out_ += kGenerationClose;
        return f;
      }
      case Node::Kind::break_: return Flow::break_;
      case Node::Kind::continue_: return Flow::continue_;
    }
    return Flow::next;
  }

  Flow loop(const Node& n, Scope& scope) {
    const Site site{where_, n.line};
    List items;
    for (Value& item : iterate(site, eval(*n.expr, scope))) {
      if (n.filter) {
        Scope test{&scope, {}};
        bind(site, n, item, test);
        if (!truthy(eval(*n.filter, test))) continue;
      }
      items.push_back(std::move(item));
    }
    const int64_t count = static_cast<int64_t>(items.size());
    bool finished = false;
    for (int64_t k = 0; k < count; ++k) {
      // Each iteration starts from the scope around the loop: what one sets, the next does not see.
      Scope body{&scope, {}};
      bind(site, n, items[static_cast<size_t>(k)], body);
      Dict loop = {{"index", Value::integer(k + 1)},
                   {"index0", Value::integer(k)},
                   {"revindex", Value::integer(count - k)},
                   {"revindex0", Value::integer(count - k - 1)},
                   {"first", Value::boolean(k == 0)},
                   {"last", Value::boolean(k + 1 == count)},
                   {"length", Value::integer(count)},
                   {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)},
                   {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("the loop has no previous item")},
                   {"nextitem", k + 1 < count ? items[static_cast<size_t>(k + 1)] : Value::undefined("the loop has no next item")}};
      body.set("loop", Value::of_dict(std::move(loop)));
      const Flow f = nodes_(n.body, body);
      if (f == Flow::break_) break;
      finished = finished || f == Flow::next;
    }
    // Jinja's compiled loop clears its "no iteration" flag at the end of the body, which break and
    // continue skip: else runs unless some iteration ran its body to the end.
    if (!finished) return nodes_(n.else_body, scope);
    return Flow::next;
  }

  void bind(const Site& site, const Node& n, const Value& item, Scope& body) {
    if (n.targets.size() == 1) {
      body.set(n.targets[0], item);
      return;
    }
    if (!item.is(Value::Kind::list) || item.list->size() != n.targets.size())
      site.fail("cannot unpack " + std::string(type_name(item)) + " into " + std::to_string(n.targets.size()) + " loop variables");
    for (size_t k = 0; k < n.targets.size(); ++k) body.set(n.targets[k], (*item.list)[k]);
  }

  Value call_macro(const Site& site, const Value& m, const Args& args, const Kwargs& kwargs) {
    const Node& def = *m.macro->node;
    if (args.size() > def.params.size())
      site.fail("macro " + def.targets[0] + " takes " + std::to_string(def.params.size()) + " arguments");
    Scope scope{&globals_, {}};
    for (size_t k = 0; k < def.params.size(); ++k) {
      const std::string& p = def.params[k];
      const Value* given = nullptr;
      for (const auto& [key, v] : kwargs)
        if (key == p) given = &v;
      if (k < args.size()) scope.set(p, args[k]);
      else if (given != nullptr) scope.set(p, *given);
      else if (def.defaults[k]) scope.set(p, eval(*def.defaults[k], scope));
      else scope.set(p, Value::undefined("'" + p + "' is undefined"));
    }
    for (const auto& [key, v] : kwargs) {
      bool known = false;
      for (const auto& p : def.params) known = known || p == key;
      if (!known) site.fail("macro " + def.targets[0] + " has no parameter " + key);
    }
    std::string text;
    std::string* saved = std::exchange(out_, &text);
    nodes_(def.body, scope);
    out_ = saved;
    return Value::string(std::move(text));
  }

  Value eval(const Expr& e, Scope& scope) {
    const Site site{where_, e.line};
    switch (e.kind) {
      case Expr::Kind::literal: return e.literal;
      case Expr::Kind::name: {
        const Value* v = scope.find(e.name);
        return v != nullptr ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::attr: {
        const Value obj = defined(site, eval(*e.args[0], scope));
        if (const Value* v = obj.find(e.name)) return *v;
        if (obj.is(Value::Kind::list) && !e.name.empty() && e.name.find_first_not_of("0123456789") == std::string::npos)
          return item(site, obj, Value::integer(std::stoll(e.name)));
        return Value::undefined(std::string(type_name(obj)) + " object has no attribute '" + e.name + "'");
      }
      case Expr::Kind::item: return item(site, defined(site, eval(*e.args[0], scope)), eval(*e.args[1], scope));
      case Expr::Kind::slice: return slice(site, e, scope);
      case Expr::Kind::call: return call(site, e, scope);
      case Expr::Kind::filter: {
        const Value v = eval(*e.args[0], scope);
        auto [args, kwargs] = arguments(e, scope, 1);
        return apply_filter(site, e.name, v, args, kwargs);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.args[0], scope);
        auto [args, kwargs] = arguments(e, scope, 1);
        return Value::boolean(apply_test(site, e.name, v, args) != e.negated);
      }
      case Expr::Kind::unary: {
        const Value v = defined(site, eval(*e.args[0], scope));
        if (!v.is_number()) site.fail(std::string("bad operand type for unary ") + e.name + ": " + type_name(v));
        if (e.name == "+") return v.is(Value::Kind::floating) ? v : Value::integer(v.is(Value::Kind::boolean) ? v.b : v.i);
        return v.is(Value::Kind::floating) ? Value::floating(-v.f) : Value::integer(-(v.is(Value::Kind::boolean) ? v.b : v.i));
      }
      case Expr::Kind::binary: return binary_op(site, e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          const std::string& op = e.ops[k];
          bool ok = false;
          if (op == "==") ok = equal(left, right);
          else if (op == "!=") ok = !equal(left, right);
          else if (op == "<") ok = less(site, left, right);
          else if (op == ">") ok = less(site, right, left);
          else if (op == "<=") ok = !less(site, right, left);
          else if (op == ">=") ok = !less(site, left, right);
          else if (op == "in") ok = contains(site, right, left);
          else ok = !contains(site, right, left);
          if (!ok) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::and_: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? eval(*e.args[1], scope) : a;
      }
      case Expr::Kind::or_: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? a : eval(*e.args[1], scope);
      }
      case Expr::Kind::not_: return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case Expr::Kind::cond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        return e.args.size() > 2 ? eval(*e.args[2], scope) : Value::undefined("the conditional has no else");
      case Expr::Kind::list: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return e.name == "tuple" ? Value::of_tuple(std::move(items)) : Value::of_list(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict items;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k], scope);
          if (!key.is(Value::Kind::string)) site.fail(std::string("a dict key must be a string here, got ") + type_name(key));
          items.emplace_back(key.s, eval(*e.args[k + 1], scope));
        }
        return Value::of_dict(std::move(items));
      }
    }
    return Value();
  }

  // Jinja's Undefined refuses an attribute or an item of itself.
  static const Value& defined(const Site& site, const Value& v) {
    if (v.is(Value::Kind::undefined)) site.fail(v.s);
    return v;
  }

  std::pair<Args, Kwargs> arguments(const Expr& e, Scope& scope, size_t first) {
    Args args;
    Kwargs kwargs;
    for (size_t k = first; k < e.args.size(); ++k) args.push_back(eval(*e.args[k], scope));
    for (const auto& [key, x] : e.kwargs) kwargs.emplace_back(key, eval(*x, scope));
    return {std::move(args), std::move(kwargs)};
  }

  Value call(const Site& site, const Expr& e, Scope& scope) {
    const Expr& callee = *e.args[0];
    auto [args, kwargs] = arguments(e, scope, 1);
    if (callee.kind == Expr::Kind::attr) {
      const Value obj = defined(site, eval(*callee.args[0], scope));
      if (const Value* v = obj.find(callee.name); v != nullptr && v->is(Value::Kind::macro)) return call_macro(site, *v, args, kwargs);
      return call_method(site, obj, callee.name, args, kwargs);
    }
    if (callee.kind == Expr::Kind::name) {
      const Value* v = scope.find(callee.name);
      if (v != nullptr && v->is(Value::Kind::macro)) return call_macro(site, *v, args, kwargs);
      Value out;
      if (v == nullptr && call_global(site, callee.name, args, kwargs, out)) return out;
      if (v == nullptr) site.fail("'" + callee.name + "' is undefined");
      site.fail(std::string("'") + type_name(*v) + "' object is not callable");
    }
    const Value v = eval(callee, scope);
    if (v.is(Value::Kind::macro)) return call_macro(site, v, args, kwargs);
    site.fail(std::string("'") + type_name(v) + "' object is not callable");
  }

  static Value item(const Site& site, const Value& obj, const Value& key) {
    if (obj.is(Value::Kind::dict) || obj.is(Value::Kind::ns)) {
      if (!key.is(Value::Kind::string)) return Value::undefined("a dict key of type " + std::string(type_name(key)));
      const Value* v = obj.find(key.s);
      return v != nullptr ? *v : Value::undefined("dict object has no element '" + key.s + "'");
    }
    if (obj.is(Value::Kind::list) || obj.is(Value::Kind::string)) {
      if (!key.is(Value::Kind::integer)) site.fail(std::string(type_name(obj)) + " indices must be integers, not " + type_name(key));
      const std::vector<std::string> chars = obj.is(Value::Kind::string) ? characters(obj.s) : std::vector<std::string>{};
      const int64_t n = obj.is(Value::Kind::list) ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(chars.size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value::undefined(std::string(type_name(obj)) + " object has no element " + std::to_string(key.i));
      return obj.is(Value::Kind::list) ? (*obj.list)[static_cast<size_t>(k)] : Value::string(chars[static_cast<size_t>(k)]);
    }
    site.fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
  }

  Value slice(const Site& site, const Expr& e, Scope& scope) {
    const Value obj = defined(site, eval(*e.args[0], scope));
    int64_t bound[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<size_t>(k) + 1]) continue;
      const Value v = eval(*e.args[static_cast<size_t>(k) + 1], scope);
      if (v.is(Value::Kind::none)) continue;
      if (!v.is(Value::Kind::integer)) site.fail("slice indices must be integers");
      bound[k] = v.i;
      given[k] = true;
    }
    const int64_t step = bound[2];
    if (step == 0) site.fail("slice step cannot be zero");
    const std::vector<std::string> chars = obj.is(Value::Kind::string) ? characters(obj.s) : std::vector<std::string>{};
    if (!obj.is(Value::Kind::list) && !obj.is(Value::Kind::string))
      site.fail(std::string("'") + type_name(obj) + "' object cannot be sliced");
    const int64_t n = obj.is(Value::Kind::list) ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(chars.size());
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](int64_t v, bool is_given, int64_t dflt) {
      if (!is_given) return dflt;
      if (v < 0) v += n;
      if (v < 0) return step < 0 ? int64_t{-1} : int64_t{0};
      if (v >= n) return step < 0 ? n - 1 : n;
      return v;
    };
    const int64_t start = adjust(bound[0], given[0], step < 0 ? n - 1 : 0);
    const int64_t stop = adjust(bound[1], given[1], step < 0 ? -1 : n);
    List items;
    std::string text;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (obj.is(Value::Kind::list)) items.push_back((*obj.list)[static_cast<size_t>(k)]);
      else text += chars[static_cast<size_t>(k)];
    }
    return obj.is(Value::Kind::list) ? Value::of_list(std::move(items)) : Value::string(std::move(text));
  }

  const std::string& where_;
  Scope& globals_;
  std::string* out_ = nullptr;
};

}  // namespace

Template::Template(const std::string& source, std::string where)
    : where_(std::move(where)),
      nodes_(std::make_shared<const std::vector<Node>>(parse_template(split_template(source, where_), where_))) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

Rendered Template::render(const Value& variables) const {
  Scope globals;
  if (variables.is(Value::Kind::dict))
    for (const auto& [k, v] : *variables.dict) globals.set(k, v);
  return Renderer(where_, globals).run(*nodes_);
}

}  // namespace zeroth::jinja
