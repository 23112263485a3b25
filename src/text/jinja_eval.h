#pragma once
// Rendering a parsed chat template (jinja_eval.cpp), and the builtins it
// calls: filters, tests, attributes and methods, operators (jinja_builtins.cpp).

#include <string>
#include <utility>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace fsdp::text::jinja {

struct RenderOutput {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_ranges;  // byte offsets into text
};

/// Renders `body` with `variables` (and transformers' globals); throws
/// std::runtime_error "origin:line: message".
RenderOutput render(const Body& body, const Dict& variables, const std::string& origin);

/// The filter `name` applied to `operand` (names known_filter accepts).
Value apply_filter(const std::string& name, const Value& operand, CallArgs& args);
/// The test `name` of `operand` (names known_test accepts).
bool apply_test(const std::string& name, const Value& operand, CallArgs& args);
/// Jinja's obj.name: a dict's method or item, a str's or list's method, a
/// namespace's attribute; Undefined where Jinja gives Undefined.
Value get_attribute(const Value& obj, const std::string& name);
/// Jinja's obj[key].
Value get_item(const Value& obj, const Value& key);
/// obj[start:stop:step] of a str, list or tuple (nulls for gaps).
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
/// Python's binary operators + - * / // % ** on values.
Value binary_operation(const std::string& op, const Value& a, const Value& b);
/// Python's `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
/// The items a for loop visits: a list's items, a dict's keys, a str's characters.
std::vector<Value> iterate(const Value& v);
/// Calls a function value; throws for anything else (an Undefined's own error first).
Value call_value(const Value& callee, CallArgs& args);
/// The globals transformers adds: range, dict, namespace, raise_exception,
/// strftime_now (and Jinja's cycler-free rest is absent).
void add_globals(Dict& globals);
/// Throws the error an Undefined value raises where it is used.
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace fsdp::text::jinja
