#pragma once
// The values a chat template computes with, as Jinja (Python) sees them:
// None, bool, int, float, str, list/tuple, dict (insertion ordered), a
// namespace, a callable, and Jinja's Undefined; with Python's str()/repr()
// and json.dumps of them, and conversion from JSON.

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fsdp::text::jinja {

struct Value;
struct Dict;
struct CallArgs;
/// A function a template can call: a global (range, namespace, ...), a bound
/// method ('a b'.split), a macro, loop.cycle.
using Function = std::function<Value(CallArgs&)>;

/// What a template reports at render time; the renderer adds origin and line.
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, function };

struct Value {
  Kind kind = Kind::undefined;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string string;  // a str's UTF-8; an Undefined's description for errors
  std::shared_ptr<std::vector<Value>> list;
  std::shared_ptr<Dict> dict;  // a dict's or a namespace's items
  std::shared_ptr<Function> function;
  bool is_tuple = false;
  // A list that Python holds as another type: "generator", "list_reverseiterator"
  // (printing shows an address; no len), "dict_items", "dict_keys",
  // "dict_values", "range" (printed as such; its repr is in `string`); on a
  // namespace, "LoopContext" (a for loop's `loop`, printed as Jinja does).
  const char* view = nullptr;
  // How deep lists and dicts nest in this value (0 for a scalar), kept as
  // containers are made, so that a template nesting [x] in a loop is refused
  // before freeing or printing it recurses past the stack.
  int nesting = 0;
  bool is_markup = false;  // |safe's or |escape's result: markupsafe's Markup, which + escapes the other side for

  static Value none();
  static Value from(bool b);
  static Value from(int64_t i);
  static Value from(int i) { return from(static_cast<int64_t>(i)); }
  static Value from(double f);
  static Value from(std::string s);
  static Value from(const char* s) { return from(std::string(s)); }
  static Value make_list(std::vector<Value> items = {});
  static Value make_tuple(std::vector<Value> items);
  static Value make_view(std::vector<Value> items, const char* view);
  static Value make_dict();
  static Value make_namespace();
  static Value make_function(Function f);
  /// Undefined, remembering what was looked up for the error it raises when used.
  static Value undefined(std::string description);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_list() const { return kind == Kind::list; }
  /// A generator or reverse iterator: truthy, no len(), printed with an address.
  bool is_iterator() const;
  bool is_dict() const { return kind == Kind::dict; }
  /// Python's truth value.
  bool truthy() const;
  /// The number as a double (bool and int included).
  double as_double() const;
  /// Recomputes `nesting` of a list, dict or namespace from its items; throws past the limit.
  void refresh_nesting();
  /// How deep this value nests now (a namespace's as its attributes stand).
  int current_nesting() const;
};

/// Insertion-ordered mapping; keys are values (str mostly, as JSON gives).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  int nesting = 0;  // a namespace's, which grows as attributes are set (Value::nesting for the rest)
  /// The value under `key`, or nullptr.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  /// Sets `key` (appending a new key at the end, as Python does).
  void set(const Value& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  /// The argument named `name` or at `position`, else nullptr; marks it used.
  const Value* get(size_t position, const std::string& name);
  /// The positional argument at `position` only, else nullptr; marks it used.
  const Value* get_positional(size_t position);
  /// The keyword argument `name` only, else nullptr; marks it used.
  const Value* get_keyword(const std::string& name);
  /// Refuses arguments that `get` did not take, naming `function`.
  void expect_all_used(const std::string& function) const;
  std::vector<bool> used_positional, used_keywords;
};

/// The type name Python gives (for error messages): 'str', 'list', ...
std::string type_name(const Value& v);
/// Python's str(v) (Undefined prints as "").
std::string to_str(const Value& v);
/// Python's repr(v).
std::string to_repr(const Value& v);
/// Python's repr of a float: the shortest digits that read back the same.
std::string float_repr(double f);
/// Whether `v` holds (at any depth) the namespace or dict whose items are `items`.
bool holds(const Value& v, const Dict* items);
/// Python's == between values.
bool equals(const Value& a, const Value& b);
/// Python's <: numbers with numbers, strings with strings, sequences; else throws.
bool less_than(const Value& a, const Value& b);

/// Options of json.dumps that transformers' tojson passes through.
struct JsonDumpOptions {
  bool has_indent = false;
  std::string indent;  // one level's indentation
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
/// Python's json.dumps(v, ...); throws for values JSON cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);
/// A JSON value as the template sees it (objects keep their key order).
Value from_json(const nlohmann::ordered_json& j);

/// UTF-8 helpers on Python's code point view of a str.
std::vector<uint32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t code_point_count(const std::string& s);

}  // namespace fsdp::text::jinja
