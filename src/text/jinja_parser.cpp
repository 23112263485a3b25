// Jinja's grammar for the subset chat templates use (see jinja_ast.h):
// expressions with Jinja's precedence, and the statements if, for, set,
// macro, filter, generation, break, continue. Everything else is refused here,
// at load time, naming the line and the construct.
#include <stdexcept>

#include "text/jinja_ast.h"

namespace fsdp::text::jinja {
namespace {

constexpr int kMaxNesting = 100;  // expressions and blocks; deeper input is refused, not recursed into

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin) : tokens_(std::move(tokens)), origin_(origin) {}
  Body parse_all();
  bool has_generation = false;

 private:
  const Token& peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool at_op(const char* op) const { return peek().type == TokenType::op && peek().text == op; }
  bool at_name(const char* name) const { return peek().type == TokenType::name && peek().text == name; }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& what, int line = 0) const {
    throw std::runtime_error(origin_ + ":" + std::to_string(line ? line : peek().line) + ": " + what);
  }
  std::string describe(const Token& t) const;
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', found " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().type != TokenType::name) fail("expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_block_end(const std::string& statement) {
    if (peek().type != TokenType::block_end)
      fail("expected the end of {% " + statement + " %}, found " + describe(peek()));
    next();
  }
  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail("expressions or blocks nested deeper than " + std::to_string(kMaxNesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  Body parse_body(const std::vector<std::string>& end_names, std::string& found_end);
  NodePtr parse_statement();
  NodePtr parse_if(int line);
  NodePtr parse_for(int line);
  NodePtr parse_set(int line);
  NodePtr parse_macro(int line);
  NodePtr parse_filter_block(int line);
  NodePtr parse_generation(int line);
  void parse_assign_targets(Node& node);

  ExprPtr parse_expression(bool allow_conditional = true);
  ExprPtr parse_tuple_or_expression(bool allow_conditional = true);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filters = true);
  ExprPtr parse_primary();
  ExprPtr parse_sequence_literal(int line, const char* close, ExprKind kind);
  ExprPtr parse_dict_literal(int line);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr e);
  ExprPtr parse_filters_and_tests(ExprPtr e);
  ExprPtr parse_filter(ExprPtr operand);
  ExprPtr parse_test(ExprPtr operand);
  void parse_call_arguments(Expr& call);

  std::vector<Token> tokens_;
  const std::string& origin_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for loops around the statement being parsed, within its function
};

std::string Parser::describe(const Token& t) const {
  switch (t.type) {
    case TokenType::text: return "template text";
    case TokenType::variable_begin: return "'{{'";
    case TokenType::variable_end: return "'}}'";
    case TokenType::block_begin: return "'{%'";
    case TokenType::block_end: return "'%}'";
    case TokenType::string: return "a string literal";
    case TokenType::integer:
    case TokenType::floating: return "the number " + t.text;
    case TokenType::end: return "the end of the template";
    default: return "'" + t.text + "'";
  }
}

Body Parser::parse_all() {
  std::string found;
  Body body = parse_body({}, found);
  return body;
}

// Nodes up to a {% name %} of `end_names` (consumed up to the name; its name
// in `found_end`), or to the end of the template when `end_names` is empty.
Body Parser::parse_body(const std::vector<std::string>& end_names, std::string& found_end) {
  DepthGuard guard(*this);
  Body body;
  for (;;) {
    const Token& t = peek();
    if (t.type == TokenType::end) {
      if (end_names.empty()) return body;
      fail("the template ends where {% " + end_names.back() + " %} was expected");
    }
    if (t.type == TokenType::text) {
      auto node = std::make_unique<Node>();
      node->kind = NodeKind::text;
      node->line = t.line;
      node->text = next().text;
      body.push_back(std::move(node));
    } else if (t.type == TokenType::variable_begin) {
      next();
      auto node = std::make_unique<Node>();
      node->kind = NodeKind::output;
      node->line = t.line;
      node->expr = parse_tuple_or_expression();
      if (peek().type != TokenType::variable_end) fail("expected '}}', found " + describe(peek()));
      next();
      body.push_back(std::move(node));
    } else if (t.type == TokenType::block_begin) {
      const Token& name = peek(1);
      for (const auto& end : end_names)
        if (name.type == TokenType::name && name.text == end) {
          next();
          next();
          found_end = end;
          return body;
        }
      next();
      body.push_back(parse_statement());
    } else {
      fail("unexpected " + describe(t));
    }
  }
}

NodePtr Parser::parse_statement() {
  int line = peek().line;
  if (peek().type != TokenType::name) fail("expected a statement name after '{%', found " + describe(peek()));
  std::string name = next().text;
  if (name == "if") return parse_if(line);
  if (name == "for") return parse_for(line);
  if (name == "set") return parse_set(line);
  if (name == "macro") return parse_macro(line);
  if (name == "filter") return parse_filter_block(line);
  if (name == "generation") return parse_generation(line);
  if (name == "break" || name == "continue") {
    // As Python, which Jinja compiles to: a macro's or {% generation %}'s body is a function of its own.
    if (loop_depth_ == 0) fail("{% " + name + " %} outside a loop", line);
    expect_block_end(name);
    auto node = std::make_unique<Node>();
    node->kind = name == "break" ? NodeKind::loop_break : NodeKind::loop_continue;
    node->line = line;
    return node;
  }
  static const char* const closers[] = {"endif", "elif", "else", "endfor", "endset", "endmacro", "endfilter",
                                       "endgeneration", "endraw"};
  for (const char* closer : closers)
    if (name == closer) fail("{% " + name + " %} where no open block takes it", line);
  fail("unsupported statement {% " + name + " %}", line);
}

NodePtr Parser::parse_if(int line) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::if_chain;
  node->line = line;
  node->conditions.push_back(parse_tuple_or_expression());
  expect_block_end("if");
  for (;;) {
    std::string end;
    node->branches.push_back(parse_body({"elif", "else", "endif"}, end));
    if (end == "endif") break;
    if (end == "elif") {
      node->conditions.push_back(parse_tuple_or_expression());
      expect_block_end("elif");
      continue;
    }
    expect_block_end("else");
    node->branches.push_back(parse_body({"endif"}, end));
    break;
  }
  expect_block_end("endif");
  return node;
}

void Parser::parse_assign_targets(Node& node) {
  bool parenthesized = skip_op("(");
  node.targets.push_back(expect_name());
  while (skip_op(",")) {
    node.unpack = true;
    if (peek().type != TokenType::name) break;  // a trailing comma
    node.targets.push_back(expect_name());
  }
  if (parenthesized) {
    expect_op(")");
    node.unpack = true;
  }
}

NodePtr Parser::parse_for(int line) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::for_loop;
  node->line = line;
  parse_assign_targets(*node);
  if (!skip_name("in")) fail("expected 'in' in {% for %}, found " + describe(peek()));
  node->expr = parse_tuple_or_expression(false);  // `for x in xs if c` filters; it is no a-if-b-else-c
  if (skip_name("if")) node->loop_filter = parse_expression();
  if (at_name("recursive")) fail("unsupported {% for ... recursive %}");
  expect_block_end("for");
  std::string end;
  ++loop_depth_;
  node->body = parse_body({"else", "endfor"}, end);
  --loop_depth_;
  if (end == "else") {
    expect_block_end("else");
    node->else_body = parse_body({"endfor"}, end);
  }
  expect_block_end("endfor");
  return node;
}

NodePtr Parser::parse_set(int line) {
  auto node = std::make_unique<Node>();
  node->line = line;
  if (peek().type == TokenType::name && peek(1).type == TokenType::op && peek(1).text == ".") {
    node->kind = NodeKind::set_attribute;
    node->targets.push_back(next().text);
    next();
    node->text = expect_name();
    expect_op("=");
    node->expr = parse_tuple_or_expression();
    expect_block_end("set");
    return node;
  }
  parse_assign_targets(*node);
  if (skip_op("=")) {
    node->kind = NodeKind::set;
    node->expr = parse_tuple_or_expression();
    expect_block_end("set");
    return node;
  }
  if (node->unpack) fail("a block {% set %} takes one name");
  node->kind = NodeKind::set_block;
  if (at_op("|")) node->expr = parse_filters_and_tests(nullptr);
  expect_block_end("set");
  std::string end;
  node->body = parse_body({"endset"}, end);
  expect_block_end("endset");
  return node;
}

NodePtr Parser::parse_macro(int line) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::macro;
  node->line = line;
  node->text = expect_name();
  expect_op("(");
  while (!skip_op(")")) {
    if (!node->params.empty()) expect_op(",");
    if (skip_op(")")) break;
    node->params.push_back(expect_name());
    node->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
  }
  expect_block_end("macro");
  std::string end;
  int outer_loops = loop_depth_;
  loop_depth_ = 0;
  node->body = parse_body({"endmacro"}, end);
  loop_depth_ = outer_loops;
  if (peek().type == TokenType::name) next();  // {% endmacro name %}
  expect_block_end("endmacro");
  return node;
}

NodePtr Parser::parse_filter_block(int line) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::filter_block;
  node->line = line;
  node->expr = parse_filter(nullptr);
  while (at_op("|")) {
    next();
    node->expr = parse_filter(std::move(node->expr));
  }
  expect_block_end("filter");
  std::string end;
  node->body = parse_body({"endfilter"}, end);
  expect_block_end("endfilter");
  return node;
}

NodePtr Parser::parse_generation(int line) {
  has_generation = true;
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::generation;
  node->line = line;
  expect_block_end("generation");
  std::string end;
  int outer_loops = loop_depth_;
  loop_depth_ = 0;
  node->body = parse_body({"endgeneration"}, end);
  loop_depth_ = outer_loops;
  expect_block_end("endgeneration");
  return node;
}

// ---- expressions, in Jinja's order of precedence ----

// `a, b` where Jinja reads a tuple without parentheses ({{ }}, if, for, set).
ExprPtr Parser::parse_tuple_or_expression(bool allow_conditional) {
  int line = peek().line;
  ExprPtr first = parse_expression(allow_conditional);
  if (!at_op(",")) return first;
  auto tuple = make(ExprKind::tuple, line);
  tuple->children.push_back(std::move(first));
  while (skip_op(",")) {
    if (peek().type == TokenType::block_end || peek().type == TokenType::variable_end) break;
    tuple->children.push_back(parse_expression(allow_conditional));
  }
  return tuple;
}

ExprPtr Parser::parse_expression(bool allow_conditional) {
  DepthGuard guard(*this);
  ExprPtr e = parse_or();
  while (allow_conditional && at_name("if")) {
    int line = next().line;
    auto cond = make(ExprKind::conditional, line);
    cond->children.push_back(parse_or());  // the condition
    cond->children.push_back(std::move(e));
    cond->children.push_back(skip_name("else") ? parse_expression() : nullptr);
    e = std::move(cond);
  }
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (at_name("or")) {
    auto node = make(ExprKind::logical_or, next().line);
    node->children.push_back(std::move(e));
    node->children.push_back(parse_and());
    e = std::move(node);
  }
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (at_name("and")) {
    auto node = make(ExprKind::logical_and, next().line);
    node->children.push_back(std::move(e));
    node->children.push_back(parse_not());
    e = std::move(node);
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (at_name("not")) {
    DepthGuard guard(*this);
    auto node = make(ExprKind::logical_not, next().line);
    node->children.push_back(parse_not());
    return node;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  int line = peek().line;
  ExprPtr first = parse_math1();
  ExprPtr chain;
  for (;;) {
    std::string op;
    if (peek().type == TokenType::op &&
        (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
         peek().text == "<=" || peek().text == ">="))
      op = next().text;
    else if (skip_name("in"))
      op = "in";
    else if (at_name("not") && peek(1).type == TokenType::name && peek(1).text == "in") {
      next();
      next();
      op = "not in";
    } else {
      break;
    }
    if (!chain) {
      chain = make(ExprKind::compare, line);
      chain->children.push_back(std::move(first));
    }
    chain->comparisons.push_back(op);
    chain->children.push_back(parse_math1());
  }
  return chain ? std::move(chain) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (at_op("+") || at_op("-")) {
    auto node = make(ExprKind::binary, peek().line);
    node->name = next().text;
    node->children.push_back(std::move(e));
    node->children.push_back(parse_concat());
    e = std::move(node);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math2();
  if (!at_op("~")) return e;
  auto node = make(ExprKind::concat, peek().line);
  node->children.push_back(std::move(e));
  while (skip_op("~")) node->children.push_back(parse_math2());
  return node;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    auto node = make(ExprKind::binary, peek().line);
    node->name = next().text;
    node->children.push_back(std::move(e));
    node->children.push_back(parse_pow());
    e = std::move(node);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary();
  while (at_op("**")) {
    auto node = make(ExprKind::binary, peek().line);
    node->name = next().text;
    node->children.push_back(std::move(e));
    node->children.push_back(parse_unary());
    e = std::move(node);
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filters) {
  DepthGuard guard(*this);
  ExprPtr e;
  if (at_op("-") || at_op("+")) {
    auto node = make(next().text == "-" ? ExprKind::negate : ExprKind::plus, peek().line);
    node->children.push_back(parse_unary(false));
    e = std::move(node);
  } else {
    e = parse_postfix(parse_primary());
  }
  return with_filters ? parse_filters_and_tests(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_primary() {
  const Token& t = peek();
  int line = t.line;
  if (t.type == TokenType::name) {
    std::string name = next().text;
    if (name == "true" || name == "True") return [&] { auto e = make(ExprKind::literal, line); e->value = Value::from(true); return e; }();
    if (name == "false" || name == "False") return [&] { auto e = make(ExprKind::literal, line); e->value = Value::from(false); return e; }();
    if (name == "none" || name == "None") return [&] { auto e = make(ExprKind::literal, line); e->value = Value::none(); return e; }();
    auto e = make(ExprKind::name, line);
    e->name = name;
    return e;
  }
  if (t.type == TokenType::string) {
    std::string text;
    while (peek().type == TokenType::string) text += next().text;  // adjacent literals join
    auto e = make(ExprKind::literal, line);
    e->value = Value::from(text);
    return e;
  }
  if (t.type == TokenType::integer || t.type == TokenType::floating) {
    auto e = make(ExprKind::literal, line);
    e->value = t.type == TokenType::integer ? Value::from(t.integer) : Value::from(t.floating);
    next();
    return e;
  }
  if (skip_op("(")) {
    if (skip_op(")")) return [&] { auto e = make(ExprKind::tuple, line); return e; }();
    ExprPtr first = parse_expression();
    if (skip_op(")")) return first;
    auto tuple = make(ExprKind::tuple, line);
    tuple->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (at_op(")")) break;
      tuple->children.push_back(parse_expression());
    }
    expect_op(")");
    return tuple;
  }
  if (skip_op("[")) return parse_sequence_literal(line, "]", ExprKind::list);
  if (skip_op("{")) return parse_dict_literal(line);
  fail("expected an expression, found " + describe(t));
}

ExprPtr Parser::parse_sequence_literal(int line, const char* close, ExprKind kind) {
  auto e = make(kind, line);
  while (!skip_op(close)) {
    if (!e->children.empty()) {
      expect_op(",");
      if (skip_op(close)) break;
    }
    e->children.push_back(parse_expression());
  }
  return e;
}

ExprPtr Parser::parse_dict_literal(int line) {
  auto e = make(ExprKind::dict, line);
  while (!skip_op("}")) {
    if (!e->children.empty()) {
      expect_op(",");
      if (skip_op("}")) break;
    }
    e->children.push_back(parse_expression());
    expect_op(":");
    e->children.push_back(parse_expression());
  }
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  for (;;) {
    if (at_op(".")) {
      int line = next().line;
      auto attr = make(ExprKind::attribute, line);
      if (peek().type == TokenType::integer) {
        attr->kind = ExprKind::subscript;
        auto index = make(ExprKind::literal, line);
        index->value = Value::from(next().integer);
        attr->children.push_back(std::move(e));
        attr->children.push_back(std::move(index));
      } else {
        attr->name = expect_name();
        attr->children.push_back(std::move(e));
      }
      e = std::move(attr);
    } else if (at_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (at_op("(")) {
      auto call = make(ExprKind::call, next().line);
      call->children.push_back(std::move(e));
      parse_call_arguments(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr e) {
  int line = next().line;  // '['
  ExprPtr parts[3];
  int colons = 0;
  for (;;) {
    if (at_op(":")) {
      next();
      if (++colons > 2) fail("a slice takes at most two ':'");
      continue;
    }
    if (at_op("]")) break;
    if (parts[colons]) fail("expected ':' or ']' in a subscript, found " + describe(peek()));
    parts[colons] = parse_expression();
  }
  next();
  auto node = make(colons ? ExprKind::slice : ExprKind::subscript, line);
  node->children.push_back(std::move(e));
  if (!colons) {
    if (!parts[0]) fail("an empty subscript []", line);
    node->children.push_back(std::move(parts[0]));
  } else {
    for (auto& part : parts) node->children.push_back(std::move(part));
  }
  return node;
}

void Parser::parse_call_arguments(Expr& call) {
  std::vector<ExprPtr> keywords;
  while (!skip_op(")")) {
    if (call.children.size() + keywords.size() > 1 || !call.keyword_names.empty()) {
      expect_op(",");
      if (skip_op(")")) break;
    }
    if (at_op("*") || at_op("**")) fail("unsupported *args or **kwargs in a call");
    if (peek().type == TokenType::name && peek(1).type == TokenType::op && peek(1).text == "=") {
      call.keyword_names.push_back(next().text);
      next();
      keywords.push_back(parse_expression());
    } else {
      if (!keywords.empty()) fail("a positional argument follows a keyword argument");
      call.children.push_back(parse_expression());
    }
  }
  for (auto& k : keywords) call.children.push_back(std::move(k));
}

ExprPtr Parser::parse_filters_and_tests(ExprPtr e) {
  for (;;) {
    if (at_op("|")) {
      next();
      e = parse_filter(std::move(e));
    } else if (at_name("is")) {
      next();
      e = parse_test(std::move(e));
    } else if (at_op("(") && e) {
      auto call = make(ExprKind::call, next().line);
      call->children.push_back(std::move(e));
      parse_call_arguments(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

// `operand | name(args)`; a null operand stands for a filter block's or a block set's body.
ExprPtr Parser::parse_filter(ExprPtr operand) {
  int line = peek().line;
  std::string name = expect_name();
  while (skip_op(".")) name += "." + expect_name();
  if (!known_filter(name)) fail("unsupported filter '" + name + "'", line);
  auto filter = make(ExprKind::filter, line);
  filter->name = name;
  filter->children.push_back(std::move(operand));
  if (skip_op("(")) parse_call_arguments(*filter);
  return filter;
}

ExprPtr Parser::parse_test(ExprPtr operand) {
  int line = peek().line;
  auto test = make(ExprKind::test, line);
  test->negated = skip_name("not");
  test->name = expect_name();
  if (!known_test(test->name)) fail("unsupported test '" + test->name + "'", line);
  test->children.push_back(std::move(operand));
  if (skip_op("(")) {
    parse_call_arguments(*test);
  } else {
    const Token& t = peek();
    // Jinja's rule: a test takes one argument without parentheses when a
    // literal or a name follows, any name but else/or/and (so `x is string if
    // c else d` reads `if` as the argument, and fails as Jinja does).
    bool starts_argument = t.type == TokenType::string || t.type == TokenType::integer ||
                           t.type == TokenType::floating || (t.type == TokenType::op && (t.text == "[" || t.text == "{")) ||
                           (t.type == TokenType::name && t.text != "else" && t.text != "or" && t.text != "and");
    if (t.type == TokenType::name && t.text == "is") fail("You cannot chain multiple tests with is");
    if (starts_argument) test->children.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

}  // namespace

Body parse_template(const std::string& source, const std::string& origin, bool& has_generation) {
  Parser parser(tokenize_template(source, origin), origin);
  Body body = parser.parse_all();
  has_generation = parser.has_generation;
  return body;
}

}  // namespace fsdp::text::jinja
