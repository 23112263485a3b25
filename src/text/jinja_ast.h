#pragma once
// The parsed form of a chat template: Jinja's tokens after whitespace control
// (trim_blocks, lstrip_blocks, '-' and '+'), expressions and statements.

#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace fsdp::text::jinja {

enum class TokenType { text, variable_begin, variable_end, block_begin, block_end, name, string, integer, floating,
                       op, end };

struct Token {
  TokenType type;
  std::string text;  // text, a name, a string literal's value, an operator
  int64_t integer = 0;
  double floating = 0;
  int line = 1;
};

/// Splits a template into tokens as Jinja does with transformers' settings
/// (trim_blocks, lstrip_blocks, no trailing newline kept; {% raw %} becomes
/// text). Throws std::runtime_error "origin:line: ..." for malformed tags.
std::vector<Token> tokenize_template(const std::string& source, const std::string& origin);

enum class ExprKind { literal, name, list, tuple, dict, attribute, subscript, slice, call, filter, test, negate,
                      plus, logical_not, binary, concat, compare, logical_and, logical_or, conditional };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                   // a literal
  std::string name;              // a variable, attribute, filter, test, or a binary operator
  std::vector<ExprPtr> children;  // operands; a call's callee then arguments (keywords last); nulls for slice gaps
  std::vector<std::string> keyword_names;  // the names of a call's, filter's or test's last arguments
  std::vector<std::string> comparisons;    // the operators of a comparison chain, between children
  bool negated = false;                    // `is not`
};

enum class NodeKind { text, output, if_chain, for_loop, set, set_attribute, set_block, macro, filter_block,
                      generation, loop_break, loop_continue };

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;                   // text; set_attribute's attribute; a macro's name
  ExprPtr expr;                       // output, set value, for's iterable, a filter block's filter chain
  std::vector<ExprPtr> conditions;    // if/elif conditions (an else branch has none)
  std::vector<Body> branches;         // if/elif/else bodies
  Body body, else_body;               // for, set_block, macro, filter_block, generation
  std::vector<std::string> targets;   // for/set names (several: unpacking); set_attribute's namespace
  bool unpack = false;                // targets written as a tuple
  ExprPtr loop_filter;                // for ... if <loop_filter>
  std::vector<std::string> params;    // a macro's parameters
  std::vector<ExprPtr> defaults;      // a macro's defaults (null where none)
};

/// Parses a template; refuses (std::runtime_error "origin:line: ...")
/// statements, filters and tests outside the supported subset.
Body parse_template(const std::string& source, const std::string& origin, bool& has_generation);

/// Whether the renderer has a filter / a test of this name (jinja_builtins.cpp).
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

}  // namespace fsdp::text::jinja
