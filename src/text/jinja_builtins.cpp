// Operators, tests and globals of the chat template interpreter: Python's
// arithmetic, Jinja's tests, and the globals transformers adds (see jinja_eval.h).
#include <chrono>
#include <cstdio>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "text/jinja_eval.h"
#include "text/jinja_strings.h"

namespace fsdp::text::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox refuses longer ranges (MAX_RANGE)

bool is_integral(const Value& v) { return v.kind == Kind::integer || v.kind == Kind::boolean; }
int64_t integral(const Value& v) { return v.kind == Kind::integer ? v.integer : v.boolean; }

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw RenderError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

int64_t checked(bool overflow, int64_t value) {
  if (overflow) throw RenderError("integer arithmetic overflows 64 bits");
  return value;
}

Value repeat(const Value& sequence, int64_t times) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    if (sequence.string.size() * static_cast<size_t>(times) > (1u << 28)) throw RenderError("a repeated str over 256 MiB");
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.string;
    return Value::from(out);
  }
  if (sequence.list->size() * static_cast<size_t>(times) > (1u << 24)) throw RenderError("a repeated list too long");
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i) items.insert(items.end(), sequence.list->begin(), sequence.list->end());
  return sequence.is_tuple ? Value::make_tuple(items) : Value::make_list(items);
}

Value float_operation(const std::string& op, double x, double y) {
  if (op == "+") return Value::from(x + y);
  if (op == "-") return Value::from(x - y);
  if (op == "*") return Value::from(x * y);
  if (op == "**") {
    if (x == 0 && y < 0) throw RenderError("0.0 cannot be raised to a negative power");
    double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) throw RenderError("(34, 'Numerical result out of range')");
    return Value::from(r);
  }
  if (y == 0) throw RenderError("float division by zero");
  if (op == "/") return Value::from(x / y);
  double q = std::floor(x / y);
  if (op == "//") return Value::from(q);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value::from(m);
}

Value integer_operation(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+" || op == "-" || op == "*") {
    overflow = op == "+" ? __builtin_add_overflow(x, y, &r) : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                                                        : __builtin_mul_overflow(x, y, &r);
    return Value::from(checked(overflow, r));
  }
  if (op == "/") {
    if (y == 0) throw RenderError("division by zero");
    return Value::from(static_cast<double>(x) / static_cast<double>(y));
  }
  if (op == "//" || op == "%") {
    if (y == 0) throw RenderError("integer division or modulo by zero");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return Value::from(op == "//" ? q : m);
  }
  // "**"
  if (y < 0) return float_operation("**", static_cast<double>(x), static_cast<double>(y));
  int64_t result = 1;
  for (int64_t i = 0; i < y; ++i) {
    overflow = __builtin_mul_overflow(result, x, &result);
    checked(overflow, result);
    if (result == 0 || result == 1) break;
  }
  return Value::from(result);
}

Value make_range(CallArgs& args) {
  std::vector<int64_t> bounds;
  for (const Value& v : args.positional) {
    if (!is_integral(v)) throw RenderError("'" + type_name(v) + "' object cannot be interpreted as an integer");
    bounds.push_back(integral(v));
  }
  if (bounds.empty() || bounds.size() > 3 || !args.keywords.empty())
    throw RenderError("range expected 1 to 3 integer arguments");
  int64_t start = bounds.size() == 1 ? 0 : bounds[0], stop = bounds.size() == 1 ? bounds[0] : bounds[1];
  int64_t step = bounds.size() == 3 ? bounds[2] : 1;
  if (step == 0) throw RenderError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange)
      throw RenderError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    items.push_back(Value::from(i));
  }
  Value range = Value::make_view(std::move(items), "range");
  range.string = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
                 (step != 1 ? ", " + std::to_string(step) : std::string()) + ")";
  return range;
}

// dict(mapping or pairs, **kwargs) and namespace(...): the same arguments.
void fill_mapping(Dict& out, CallArgs& args, bool is_namespace) {
  if (args.positional.size() > 1) throw RenderError("expected at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict() || source.kind == Kind::ns) out.items = source.dict->items;
    else
      for (const Value& pair : iterate(source)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) throw RenderError("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        out.set(kv[0], kv[1]);
      }
  }
  for (const auto& [name, value] : args.keywords) out.set(Value::from(name), value);
  if (is_namespace)
    for (const auto& kv : out.items)
      if (kv.first.is_string() && !kv.first.string.empty() && kv.first.string[0] == '_')
        throw RenderError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                          kv.first.string + "'. Please rename the attribute.");
}

// transformers' strftime_now: datetime.now().strftime(format). Python itself
// writes %f (microseconds), and %z and %Z of a naive datetime as nothing; the
// rest is the C library's strftime, as in CPython.
Value strftime_now(CallArgs& args) {
  const Value* format = args.get(0, "format");
  if (!format || !format->is_string()) throw RenderError("strftime_now expects a format string");
  args.expect_all_used("strftime_now");
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::string c_format;
  const std::string& f = format->string;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%' || i + 1 >= f.size()) {
      c_format += f[i];
      continue;
    }
    char directive = f[++i];
    if (directive == 'f') {
      char digits[8];
      std::snprintf(digits, sizeof digits, "%06lld", static_cast<long long>(micros));
      c_format += digits;
    } else if (directive != 'z' && directive != 'Z') {
      c_format += '%';
      c_format += directive;
    }
  }
  std::tm local{};
  localtime_r(&seconds, &local);
  std::vector<char> buffer(c_format.size() * 16 + 64);
  size_t n = c_format.empty() ? 0 : std::strftime(buffer.data(), buffer.size(), c_format.c_str(), &local);
  return Value::from(std::string(buffer.data(), n));
}

using TestFunction = bool (*)(const Value&, CallArgs&);

// value % divisor as Python computes it (odd, even, divisibleby), as a double.
double python_modulo(const Value& value, const Value& divisor) {
  if (value.is_undefined()) fail_undefined(value);
  if (!value.is_number() || !divisor.is_number())
    throw RenderError("unsupported operand type(s) for %: '" + type_name(value) + "' and '" + type_name(divisor) + "'");
  return binary_operation("%", value, divisor).as_double();
}

const Value& test_argument(CallArgs& args, const char* test) {
  const Value* other = args.get(0, "other");
  if (!other) throw RenderError(std::string("the test '") + test + "' takes one argument");
  return *other;
}

bool sequence_test(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_dict() || (v.is_list() && (!v.view || std::string(v.view) == "range"));
}

const std::map<std::string, TestFunction>& tests() {
  static const std::map<std::string, TestFunction> table = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
      {"iterable", [](const Value& v, CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"sequence", [](const Value& v, CallArgs&) { return sequence_test(v); }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"integer", [](const Value& v, CallArgs&) { return v.kind == Kind::integer; }},
      {"float", [](const Value& v, CallArgs&) { return v.kind == Kind::floating; }},
      {"boolean", [](const Value& v, CallArgs&) { return v.kind == Kind::boolean; }},
      {"true", [](const Value& v, CallArgs&) { return v.kind == Kind::boolean && v.boolean; }},
      {"false", [](const Value& v, CallArgs&) { return v.kind == Kind::boolean && !v.boolean; }},
      {"callable", [](const Value& v, CallArgs&) { return v.kind == Kind::function || v.is_undefined(); }},  // Undefined has __call__
      {"escaped", [](const Value& v, CallArgs&) { return v.is_markup; }},
      {"lower", [](const Value& v, CallArgs&) { std::string s = to_str(v); return python_lower(s) == s && python_upper(s) != s; }},
      {"upper", [](const Value& v, CallArgs&) { std::string s = to_str(v); return python_upper(s) == s && python_lower(s) != s; }},
      {"odd", [](const Value& v, CallArgs&) { return python_modulo(v, Value::from(2)) == 1; }},
      {"even", [](const Value& v, CallArgs&) { return python_modulo(v, Value::from(2)) == 0; }},
      {"divisibleby", [](const Value& v, CallArgs& a) { return python_modulo(v, test_argument(a, "divisibleby")) == 0; }},
      {"eq", [](const Value& v, CallArgs& a) { return equals(v, test_argument(a, "eq")); }},
      {"ne", [](const Value& v, CallArgs& a) { return !equals(v, test_argument(a, "ne")); }},
      {"lt", [](const Value& v, CallArgs& a) { return less_than(v, test_argument(a, "lt")); }},
      {"gt", [](const Value& v, CallArgs& a) { return less_than(test_argument(a, "gt"), v); }},
      {"le", [](const Value& v, CallArgs& a) { return !less_than(test_argument(a, "le"), v); }},
      {"ge", [](const Value& v, CallArgs& a) { return !less_than(v, test_argument(a, "ge")); }},
      {"in", [](const Value& v, CallArgs& a) { return contains(test_argument(a, "in"), v); }},
      {"sameas", [](const Value& v, CallArgs& a) {
         const Value& o = test_argument(a, "sameas");
         if (v.kind != o.kind) return false;
         if (v.is_list() || v.is_dict() || v.kind == Kind::ns) return v.list == o.list && v.dict == o.dict;
         return equals(v, o); }},
  };
  return table;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> aliases = {
      {"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"lessthan", "lt"}, {"<", "lt"}, {"greaterthan", "gt"},
      {">", "gt"}, {"<=", "le"}, {">=", "ge"}};
  return aliases;
}

}  // namespace

Value binary_operation(const std::string& op, const Value& a, const Value& b) {
  if (op == "%" && a.is_string()) return Value::from(percent_format(a.string, b));  // str.__mod__ takes anything
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return integer_operation(op, integral(a), integral(b));
    return float_operation(op, a.as_double(), b.as_double());
  }
  if (op == "+") {
    if (a.is_string() && b.is_string() && a.is_markup != b.is_markup) {
      // Markup + str (|safe's result) escapes the plain side, as markupsafe does.
      Value joined = Value::from((a.is_markup ? a.string : html_escape(a.string)) +
                                 (b.is_markup ? b.string : html_escape(b.string)));
      joined.is_markup = true;
      return joined;
    }
    if (a.is_string() && b.is_string()) {
      Value joined = Value::from(a.string + b.string);
      joined.is_markup = a.is_markup;
      return joined;
    }
    if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple && !a.view && !b.view) {
      std::vector<Value> items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return a.is_tuple ? Value::make_tuple(items) : Value::make_list(items);
    }
    if (a.is_string()) throw RenderError("can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (a.is_list() && !a.view)
      throw RenderError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
  }
  if (op == "*") {
    if ((a.is_string() || (a.is_list() && !a.view)) && is_integral(b)) return repeat(a, integral(b));
    if ((b.is_string() || (b.is_list() && !b.view)) && is_integral(a)) return repeat(b, integral(a));
  }
  if (op == "%" && a.is_string()) return Value::from(percent_format(a.string, b));
  unsupported(op, a, b);
}

void add_globals(Dict& globals) {
  globals.set(Value::from("range"), Value::make_function(make_range));
  globals.set(Value::from("dict"), Value::make_function([](CallArgs& args) {
                Value d = Value::make_dict();
                fill_mapping(*d.dict, args, false);
                d.refresh_nesting();
                return d;
              }));
  globals.set(Value::from("namespace"), Value::make_function([](CallArgs& args) {
                Value ns = Value::make_namespace();
                fill_mapping(*ns.dict, args, true);
                ns.refresh_nesting();
                return ns;
              }));
  globals.set(Value::from("raise_exception"), Value::make_function([](CallArgs& args) -> Value {
                const Value* message = args.get(0, "message");
                throw RenderError(message ? to_str(*message) : std::string("raise_exception() without a message"));
              }));
  globals.set(Value::from("strftime_now"), Value::make_function(strftime_now));
}

bool known_test(const std::string& name) { return tests().count(name) || test_aliases().count(name); }

bool apply_test(const std::string& name, const Value& operand, CallArgs& args) {
  auto alias = test_aliases().find(name);
  const std::string& key = alias == test_aliases().end() ? name : alias->second;
  bool result = tests().at(key)(operand, args);
  args.expect_all_used("test " + name);
  return result;
}

}  // namespace fsdp::text::jinja
