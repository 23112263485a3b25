// Jinja's filters as chat templates use them, with Jinja 3.1's semantics
// (generators where Jinja returns generators) and transformers' tojson.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <unicode/uchar.h>

#include "text/jinja_eval.h"
#include "text/jinja_strings.h"

namespace fsdp::text::jinja {
namespace {

using FilterFunction = Value (*)(const Value&, CallArgs&);

Value optional_argument(CallArgs& args, size_t position, const char* name, Value fallback) {
  const Value* v = args.get(position, name);
  return v ? *v : fallback;
}

Value finish(CallArgs& args, const char* filter, Value result) {
  args.expect_all_used(std::string("filter ") + filter);
  return result;
}

Value generator(std::vector<Value> items) { return Value::make_view(std::move(items), "generator"); }

// Jinja's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value attribute_path(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    current = get_item(current, numeric ? Value::from(static_cast<int64_t>(std::atoll(part.c_str())))
                                        : Value::from(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// The sort key Jinja's sort, dictsort, unique, min and max use: strings lowered
// unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value::from(python_lower(v.string)) : v;
}

std::vector<Value> items_of(const Value& v) {
  if (v.is_undefined()) return {};
  return iterate(v);
}

// map, select and the like start with `if seq:`, so None and "" give nothing.
std::vector<Value> items_if_truthy(const Value& v) {
  if (!v.truthy()) return {};
  return iterate(v);
}

Value filter_length(const Value& v, CallArgs& args) {
  args.expect_all_used("filter length");
  if (v.is_undefined()) return Value::from(0);
  if (v.is_string()) return Value::from(static_cast<int64_t>(code_point_count(v.string)));
  if ((v.is_list() && !v.is_iterator()) || v.is_dict())
    return Value::from(static_cast<int64_t>(v.is_list() ? v.list->size() : v.dict->items.size()));
  throw RenderError("object of type '" + type_name(v) + "' has no len()");
}

Value filter_join(const Value& v, CallArgs& args) {
  std::string separator = to_str(optional_argument(args, 0, "d", Value::from("")));
  Value attribute = optional_argument(args, 1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const Value& item : items_of(v)) {
    if (!first) out += separator;
    out += to_str(attribute.is_none() ? item : attribute_path(item, to_str(attribute)));
    first = false;
  }
  return finish(args, "join", Value::from(out));
}

Value filter_map(const Value& v, CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    const Value* attribute = args.get(0, "attribute");
    if (!attribute) throw RenderError("map: expected a filter name or attribute=");
    const Value* fallback = args.get(1, "default");
    args.expect_all_used("filter map");
    for (const Value& item : items_if_truthy(v)) {
      Value x = attribute_path(item, to_str(*attribute));
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    }
    return generator(std::move(out));
  }
  std::string name = to_str(args.positional[0]);
  if (!known_filter(name)) throw RenderError("No filter named '" + name + "'.");
  for (const Value& item : items_if_truthy(v)) {
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keywords = args.keywords;
    out.push_back(apply_filter(name, item, rest));
  }
  return generator(std::move(out));
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value select_items(const Value& v, CallArgs& args, bool by_attribute, bool keep_when) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) throw RenderError("selectattr/rejectattr: expected an attribute name");
    attribute = to_str(args.positional[next++]);
  }
  std::string test;
  if (next < args.positional.size()) test = to_str(args.positional[next++]);
  if (!test.empty() && !known_test(test)) throw RenderError("No test named '" + test + "'.");
  std::vector<Value> out;
  for (const Value& item : items_if_truthy(v)) {
    Value subject = by_attribute ? attribute_path(item, attribute) : item;
    bool passed;
    if (test.empty()) {
      passed = subject.truthy();
    } else {
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + next, args.positional.end());
      rest.keywords = args.keywords;
      passed = apply_test(test, subject, rest);
    }
    if (passed == keep_when) out.push_back(item);
  }
  return generator(std::move(out));
}

Value filter_first(const Value& v, CallArgs& args) {
  args.expect_all_used("filter first");
  std::vector<Value> items = items_of(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value filter_last(const Value& v, CallArgs& args) {
  args.expect_all_used("filter last");
  if (v.is_iterator()) throw RenderError("'" + type_name(v) + "' object is not reversible");
  std::vector<Value> items = items_of(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value filter_default(const Value& v, CallArgs& args) {
  Value fallback = optional_argument(args, 0, "default_value", Value::from(""));
  bool boolean = optional_argument(args, 1, "boolean", Value::from(false)).truthy();
  args.expect_all_used("filter default");
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback;
  return v;
}

std::string jinja_title(const std::string& s) {
  // Jinja splits words at runs of [-\s({[<] and capitalizes each piece.
  std::vector<uint32_t> cps = code_points(s);
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    auto is_break = [](uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c); };
    size_t j = i;
    bool breaking = is_break(cps[i]);
    while (j < cps.size() && is_break(cps[j]) == breaking) ++j;
    std::string piece = from_code_points(cps, i, j);
    if (breaking) out += piece;
    else out += python_upper(from_code_points(cps, i, i + 1)) + python_lower(from_code_points(cps, i + 1, j));
    i = j;
  }
  return out;
}

Value filter_indent(const Value& v, CallArgs& args) {
  Value width = optional_argument(args, 0, "width", Value::from(4));
  bool first = optional_argument(args, 1, "first", Value::from(false)).truthy();
  bool blank = optional_argument(args, 2, "blank", Value::from(false)).truthy();
  args.expect_all_used("filter indent");
  if (!v.is_string()) {
    if (v.is_undefined()) fail_undefined(v);
    throw RenderError("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");  // Jinja adds "\n" first
  }
  std::string indentation = width.is_string() ? width.string : std::string(static_cast<size_t>(std::max<int64_t>(0, width.integer)), ' ');
  std::vector<std::string> lines = python_splitlines(to_str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) {
      out = lines[0];
      continue;
    }
    out += "\n";
    if (blank || !lines[i].empty()) out += indentation;
    out += lines[i];
  }
  if (first) out = indentation + out;
  return Value::from(out);
}

Value filter_int(const Value& v, CallArgs& args) {
  Value fallback = optional_argument(args, 0, "default", Value::from(0));
  int64_t base = optional_argument(args, 1, "base", Value::from(10)).integer;
  args.expect_all_used("filter int");
  if (v.is_undefined()) fail_undefined(v);  // Undefined's __int__ and __float__ raise, past the default
  if (v.kind == Kind::integer || v.kind == Kind::boolean) return Value::from(v.kind == Kind::integer ? v.integer : int64_t(v.boolean));
  // Python's int has no bound; past 64 bits this refuses rather than wrap.
  auto from_double = [](double f) {
    if (!(std::fabs(f) < 9.2e18)) throw RenderError("int(" + float_repr(f) + ") does not fit in 64 bits");
    return Value::from(static_cast<int64_t>(std::trunc(f)));
  };
  if (v.kind == Kind::floating) {
    if (!std::isfinite(v.floating)) return fallback;  // int(inf) raises OverflowError, int(nan) ValueError: the default
    return from_double(v.floating);
  }
  if (v.is_string()) {
    std::string s = python_strip(v.string, nullptr, true, true);
    if (s.find('_') != std::string::npos) throw RenderError("int('" + s + "'): digits with underscores are not read here");
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && end && *end == 0) {
      if (errno == ERANGE) throw RenderError("int('" + s + "') does not fit in 64 bits");
      return Value::from(static_cast<int64_t>(n));
    }
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0 && std::isfinite(f)) return from_double(f);
  }
  return fallback;
}

Value filter_float(const Value& v, CallArgs& args) {
  Value fallback = optional_argument(args, 0, "default", Value::from(0.0));
  args.expect_all_used("filter float");
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::from(v.as_double());
  if (v.is_string()) {
    std::string s = python_strip(v.string, nullptr, true, true);
    if (s.find('_') != std::string::npos) throw RenderError("float('" + s + "'): digits with underscores are not read here");
    if (s.find_first_of("xX") != std::string::npos) return fallback;  // C reads hex floats, Python does not
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0) return Value::from(f);
  }
  return fallback;
}

Value filter_tojson(const Value& v, CallArgs& args) {
  JsonDumpOptions o;
  Value indent = optional_argument(args, 0, "indent", Value::none());
  Value separators = optional_argument(args, 1, "separators", Value::none());
  o.sort_keys = optional_argument(args, 2, "sort_keys", Value::from(false)).truthy();
  o.ensure_ascii = optional_argument(args, 3, "ensure_ascii", Value::from(false)).truthy();
  args.expect_all_used("filter tojson");
  if (!indent.is_none()) {
    o.has_indent = true;
    o.indent = indent.is_string() ? indent.string : std::string(static_cast<size_t>(std::max<int64_t>(0, indent.integer)), ' ');
    o.item_separator = ",";
  }
  if (!separators.is_none()) {
    std::vector<Value> pair = iterate(separators);
    if (pair.size() != 2) throw RenderError("tojson: separators must be a pair of strings");
    o.item_separator = to_str(pair[0]);
    o.key_separator = to_str(pair[1]);
  }
  return Value::from(json_dumps(v, o));
}

Value filter_items(const Value& v, CallArgs& args) {
  args.expect_all_used("filter items");
  if (v.is_undefined()) return generator({});
  if (!v.is_dict()) throw RenderError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({k, x}));
  return generator(std::move(out));
}

Value filter_dictsort(const Value& v, CallArgs& args) {
  bool case_sensitive = optional_argument(args, 0, "case_sensitive", Value::from(false)).truthy();
  std::string by = to_str(optional_argument(args, 1, "by", Value::from("key")));
  bool reverse = optional_argument(args, 2, "reverse", Value::from(false)).truthy();
  args.expect_all_used("filter dictsort");
  if (!v.is_dict()) throw RenderError("dictsort: expected a mapping, found " + type_name(v));
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({k, x}));
  size_t index = by == "value" ? 1 : 0;
  std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
    return less_than(sort_key((*a.list)[index], case_sensitive), sort_key((*b.list)[index], case_sensitive));
  });
  if (reverse) std::reverse(out.begin(), out.end());
  return Value::make_list(std::move(out));
}

Value filter_sort(const Value& v, CallArgs& args) {
  bool reverse = optional_argument(args, 0, "reverse", Value::from(false)).truthy();
  bool case_sensitive = optional_argument(args, 1, "case_sensitive", Value::from(false)).truthy();
  Value attribute = optional_argument(args, 2, "attribute", Value::none());
  args.expect_all_used("filter sort");
  std::vector<Value> items = items_of(v);
  auto key = [&](const Value& x) {
    return sort_key(attribute.is_none() ? x : attribute_path(x, to_str(attribute)), case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? less_than(key(b), key(a)) : less_than(key(a), key(b));
  });
  return Value::make_list(std::move(items));
}

Value filter_unique(const Value& v, CallArgs& args) {
  bool case_sensitive = optional_argument(args, 0, "case_sensitive", Value::from(false)).truthy();
  Value attribute = optional_argument(args, 1, "attribute", Value::none());
  args.expect_all_used("filter unique");
  std::vector<Value> out, seen;
  for (const Value& item : items_of(v)) {
    Value key = sort_key(attribute.is_none() ? item : attribute_path(item, to_str(attribute)), case_sensitive);
    if ((key.is_list() && !key.is_tuple) || key.is_dict() || key.kind == Kind::ns)
      throw RenderError("unhashable type: '" + type_name(key) + "'");  // unique keeps a set of what it saw
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return generator(std::move(out));
}

Value filter_min_max(const Value& v, CallArgs& args, bool want_max) {
  bool case_sensitive = optional_argument(args, 0, "case_sensitive", Value::from(false)).truthy();
  Value attribute = optional_argument(args, 1, "attribute", Value::none());
  args.expect_all_used(want_max ? "filter max" : "filter min");
  std::vector<Value> items = items_of(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& x) {
    return sort_key(attribute.is_none() ? x : attribute_path(x, to_str(attribute)), case_sensitive);
  };
  const Value* best = &items[0];
  for (const Value& item : items)
    if (want_max ? less_than(key(*best), key(item)) : less_than(key(item), key(*best))) best = &item;
  return *best;
}

Value filter_round(const Value& v, CallArgs& args) {
  int64_t precision = optional_argument(args, 0, "precision", Value::from(0)).integer;
  std::string method = to_str(optional_argument(args, 1, "method", Value::from("common")));
  args.expect_all_used("filter round");
  if (method != "common" && method != "ceil" && method != "floor")
    throw RenderError("method must be 'common', 'ceil' or 'floor'");
  if (method == "common" && v.kind == Kind::integer) return v;
  if (method == "common" && v.kind == Kind::boolean) return Value::from(static_cast<int64_t>(v.boolean));  // round(True) is 1
  double x = v.as_double(), scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::from(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::from(std::floor(x * scale) / scale);
  if (precision == 0) return Value::from(std::nearbyint(x));
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), x);
  return Value::from(std::strtod(buf, nullptr));
}

Value filter_sum(const Value& v, CallArgs& args) {
  Value attribute = optional_argument(args, 0, "attribute", Value::none());
  Value total = optional_argument(args, 1, "start", Value::from(0));
  args.expect_all_used("filter sum");
  for (const Value& item : items_of(v))
    total = binary_operation("+", total, attribute.is_none() ? item : attribute_path(item, to_str(attribute)));
  return total;
}

Value filter_reverse(const Value& v, CallArgs& args) {
  args.expect_all_used("filter reverse");
  if (v.is_string()) {
    std::vector<uint32_t> cps = code_points(v.string);
    std::reverse(cps.begin(), cps.end());
    return Value::from(from_code_points(cps, 0, cps.size()));
  }
  std::vector<Value> items = items_of(v);
  std::reverse(items.begin(), items.end());
  // reversed() gives an iterator (printed with its address) where Python can
  // reverse in place; a generator or Undefined becomes a list first.
  if (v.is_iterator() || v.is_undefined()) return Value::make_list(std::move(items));
  return Value::make_view(std::move(items), "list_reverseiterator");
}

Value filter_truncate(const Value& v, CallArgs& args) {
  int64_t length = optional_argument(args, 0, "length", Value::from(255)).integer;
  bool killwords = optional_argument(args, 1, "killwords", Value::from(false)).truthy();
  std::string end = to_str(optional_argument(args, 2, "end", Value::from("...")));
  Value leeway_value = optional_argument(args, 3, "leeway", Value::none());
  args.expect_all_used("filter truncate");
  int64_t leeway = leeway_value.is_none() ? 5 : leeway_value.integer;
  if (!v.is_string()) {
    // Jinja measures anything with a length, and returns it whole when short enough.
    CallArgs none;
    if (filter_length(v, none).integer <= length + leeway) return v;
    throw RenderError("truncate: expected a str to shorten, found " + type_name(v));
  }
  std::vector<uint32_t> cps = code_points(to_str(v));
  int64_t end_length = static_cast<int64_t>(code_point_count(end));
  if (length < end_length) throw RenderError("expected length >= " + std::to_string(end_length) + ", got " + std::to_string(length));
  if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value::from(to_str(v));
  std::string kept = from_code_points(cps, 0, static_cast<size_t>(length - end_length));
  if (killwords) return Value::from(kept + end);
  size_t space = kept.rfind(' ');
  return Value::from((space == std::string::npos ? kept : kept.substr(0, space)) + end);
}

Value filter_batch(const Value& v, CallArgs& args) {
  int64_t size = optional_argument(args, 0, "linecount", Value::from(1)).integer;
  Value fill = optional_argument(args, 1, "fill_with", Value::none());
  bool has_fill = args.get(1, "fill_with") != nullptr;
  args.expect_all_used("filter batch");
  if (size <= 0) throw RenderError("batch: linecount must be positive");
  std::vector<Value> out, current;
  for (const Value& item : items_of(v)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      out.push_back(Value::make_list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    while (has_fill && static_cast<int64_t>(current.size()) < size) current.push_back(fill);
    out.push_back(Value::make_list(std::move(current)));
  }
  return generator(std::move(out));
}

Value filter_wordcount(const Value& v, CallArgs& args) {
  args.expect_all_used("filter wordcount");
  int64_t words = 0;
  bool in_word = false;
  for (uint32_t c : code_points(to_str(v))) {
    bool word_char = u_isalnum(static_cast<UChar32>(c)) || c == '_';
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::from(words);
}

Value filter_center(const Value& v, CallArgs& args) {
  int64_t width = optional_argument(args, 0, "width", Value::from(80)).integer;
  args.expect_all_used("filter center");
  std::string s = to_str(v);
  int64_t n = static_cast<int64_t>(code_point_count(s));
  if (width <= n) return Value::from(s);
  int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value::from(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

Value filter_format(const Value& v, CallArgs& args) {
  if (!args.keywords.empty()) {
    Value mapping = Value::make_dict();
    for (const auto& [k, x] : args.keywords) mapping.dict->set(Value::from(k), x);
    return Value::from(percent_format(to_str(v), mapping));
  }
  return Value::from(percent_format(to_str(v), Value::make_tuple(args.positional)));
}

const std::map<std::string, FilterFunction>& filters() {
  static const std::map<std::string, FilterFunction> table = {
      {"length", filter_length}, {"count", filter_length}, {"join", filter_join}, {"map", filter_map},
      {"select", [](const Value& v, CallArgs& a) { return select_items(v, a, false, true); }},
      {"reject", [](const Value& v, CallArgs& a) { return select_items(v, a, false, false); }},
      {"selectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, true); }},
      {"rejectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, false); }},
      {"first", filter_first}, {"last", filter_last}, {"default", filter_default}, {"d", filter_default},
      {"trim", [](const Value& v, CallArgs& a) {
         Value chars = optional_argument(a, 0, "chars", Value::none());
         return finish(a, "trim", Value::from(python_strip(to_str(v), chars.is_none() ? nullptr : &chars.string, true, true))); }},
      {"upper", [](const Value& v, CallArgs& a) { return finish(a, "upper", Value::from(python_upper(to_str(v)))); }},
      {"lower", [](const Value& v, CallArgs& a) { return finish(a, "lower", Value::from(python_lower(to_str(v)))); }},
      {"title", [](const Value& v, CallArgs& a) { return finish(a, "title", Value::from(jinja_title(to_str(v)))); }},
      {"capitalize", [](const Value& v, CallArgs& a) { return finish(a, "capitalize", Value::from(python_capitalize(to_str(v)))); }},
      {"replace", [](const Value& v, CallArgs& a) {
         std::string old_text = to_str(optional_argument(a, 0, "old", Value::from(""))), new_text = to_str(optional_argument(a, 1, "new", Value::from("")));
         Value count = optional_argument(a, 2, "count", Value::none());
         return finish(a, "replace", Value::from(python_replace(to_str(v), old_text, new_text, count.is_none() ? -1 : count.integer))); }},
      {"indent", filter_indent},
      {"string", [](const Value& v, CallArgs& a) { return finish(a, "string", v.is_string() ? v : Value::from(to_str(v))); }},
      {"list", [](const Value& v, CallArgs& a) { return finish(a, "list", Value::make_list(items_of(v))); }},
      {"int", filter_int}, {"float", filter_float}, {"tojson", filter_tojson}, {"items", filter_items},
      {"dictsort", filter_dictsort}, {"sort", filter_sort}, {"unique", filter_unique},
      {"safe", [](const Value& v, CallArgs& a) { Value s = Value::from(to_str(v)); s.is_markup = true; return finish(a, "safe", s); }},
      {"escape", [](const Value& v, CallArgs& a) { Value s = Value::from(v.is_markup ? v.string : html_escape(to_str(v))); s.is_markup = true; return finish(a, "escape", s); }},
      {"e", [](const Value& v, CallArgs& a) { Value s = Value::from(v.is_markup ? v.string : html_escape(to_str(v))); s.is_markup = true; return finish(a, "e", s); }},
      {"forceescape", [](const Value& v, CallArgs& a) { Value s = Value::from(html_escape(to_str(v))); s.is_markup = true; return finish(a, "forceescape", s); }},
      {"abs", [](const Value& v, CallArgs& a) {
         a.expect_all_used("filter abs");
         if (v.kind == Kind::integer || v.kind == Kind::boolean) return Value::from(std::abs(v.kind == Kind::integer ? v.integer : int64_t(v.boolean)));
         return Value::from(std::fabs(v.as_double())); }},
      {"round", filter_round}, {"sum", filter_sum},
      {"min", [](const Value& v, CallArgs& a) { return filter_min_max(v, a, false); }},
      {"max", [](const Value& v, CallArgs& a) { return filter_min_max(v, a, true); }},
      {"reverse", filter_reverse}, {"wordcount", filter_wordcount}, {"batch", filter_batch},
      {"truncate", filter_truncate}, {"center", filter_center}, {"format", filter_format},
      {"attr", [](const Value& v, CallArgs& a) {
         Value name = optional_argument(a, 0, "name", Value::from(""));
         return finish(a, "attr", get_attribute(v, to_str(name))); }},
  };
  return table;
}

}  // namespace

bool known_filter(const std::string& name) { return filters().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& operand, CallArgs& args) {
  return filters().at(name)(operand, args);
}

}  // namespace fsdp::text::jinja
