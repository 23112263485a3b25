// Values of the chat template interpreter: Python's str()/repr(), ==, <,
// json.dumps, and JSON in (see jinja_value.h).
#include "text/jinja_value.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "text/utf8.h"

namespace fsdp::text::jinja {
namespace {

// Values nest as deep as a template makes them ([x] in a loop); printing,
// comparing and converting them recurses, so past this depth they are refused.
constexpr int kMaxValueDepth = 512;
thread_local int value_depth = 0;

struct ValueDepthGuard {
  ValueDepthGuard() {
    if (++value_depth > kMaxValueDepth) {
      value_depth = 0;  // the error unwinds every guard; start afresh
      throw RenderError("values nested deeper than " + std::to_string(kMaxValueDepth));
    }
  }
  ~ValueDepthGuard() {
    if (value_depth > 0) --value_depth;
  }
};

}  // namespace

Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::from(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.boolean = b;
  return v;
}
Value Value::from(int64_t i) {
  Value v;
  v.kind = Kind::integer;
  v.integer = i;
  return v;
}
Value Value::from(double f) {
  Value v;
  v.kind = Kind::floating;
  v.floating = f;
  return v;
}
Value Value::from(std::string s) {
  Value v;
  v.kind = Kind::string;
  v.string = std::move(s);
  return v;
}
Value Value::make_list(std::vector<Value> items) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<std::vector<Value>>(std::move(items));
  v.refresh_nesting();
  return v;
}

int Value::current_nesting() const { return kind == Kind::ns ? dict->nesting : nesting; }

void Value::refresh_nesting() {
  int deepest = 0;
  if (kind == Kind::list)
    for (const Value& item : *list) deepest = std::max(deepest, item.current_nesting());
  if (kind == Kind::dict || kind == Kind::ns)
    for (const auto& [key, item] : dict->items) deepest = std::max({deepest, key.current_nesting(), item.current_nesting()});
  nesting = deepest + 1;
  if (kind == Kind::ns) dict->nesting = nesting;
  if (nesting > kMaxValueDepth)
    throw RenderError("values nested deeper than " + std::to_string(kMaxValueDepth));
}

bool holds(const Value& v, const Dict* items) {
  ValueDepthGuard guard;
  if ((v.kind == Kind::dict || v.kind == Kind::ns) && v.dict.get() == items) return true;
  if (v.kind == Kind::list)
    for (const Value& item : *v.list)
      if (holds(item, items)) return true;
  if (v.kind == Kind::dict || v.kind == Kind::ns)
    for (const auto& [key, item] : v.dict->items)
      if (holds(item, items)) return true;
  return false;
}
Value Value::make_tuple(std::vector<Value> items) {
  Value v = make_list(std::move(items));
  v.is_tuple = true;
  return v;
}
Value Value::make_view(std::vector<Value> items, const char* view) {
  Value v = make_list(std::move(items));
  v.view = view;
  return v;
}
bool Value::is_iterator() const {
  return kind == Kind::list && view && (std::strcmp(view, "generator") == 0 || std::strcmp(view, "list_reverseiterator") == 0);
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_namespace() {
  Value v;
  v.kind = Kind::ns;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_function(Function f) {
  Value v;
  v.kind = Kind::function;
  v.function = std::make_shared<Function>(std::move(f));
  return v;
}
Value Value::undefined(std::string description) {
  Value v;
  v.string = std::move(description);
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return boolean;
    case Kind::integer: return integer != 0;
    case Kind::floating: return floating != 0;
    case Kind::string: return !string.empty();
    case Kind::list: return is_iterator() || !list->empty();
    case Kind::dict: return !dict->items.empty();
    default: return true;
  }
}

double Value::as_double() const {
  if (kind == Kind::floating) return floating;
  if (kind == Kind::integer) return static_cast<double>(integer);
  if (kind == Kind::boolean) return boolean ? 1 : 0;
  throw RenderError("expected a number, found " + type_name(*this));
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}
const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k.kind == Kind::string && k.string == key) return &v;
  return nullptr;
}
void Dict::set(const Value& key, Value value) {
  for (auto& [k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get_positional(size_t position) {
  used_positional.resize(positional.size());
  if (position >= positional.size()) return nullptr;
  used_positional[position] = true;
  return &positional[position];
}

const Value* CallArgs::get_keyword(const std::string& name) {
  used_keywords.resize(keywords.size());
  for (size_t i = 0; i < keywords.size(); ++i)
    if (keywords[i].first == name) {
      used_keywords[i] = true;
      return &keywords[i].second;
    }
  return nullptr;
}

const Value* CallArgs::get(size_t position, const std::string& name) {
  const Value* v = get_positional(position);
  return v ? v : get_keyword(name);
}

void CallArgs::expect_all_used(const std::string& function) const {
  for (size_t i = 0; i < positional.size(); ++i)
    if (i >= used_positional.size() || !used_positional[i])
      throw RenderError(function + "() takes fewer positional arguments than the " +
                        std::to_string(positional.size()) + " given");
  for (size_t i = 0; i < keywords.size(); ++i)
    if (i >= used_keywords.size() || !used_keywords[i])
      throw RenderError(function + "() got an unexpected keyword argument '" + keywords[i].first + "'");
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return v.view ? v.view : v.is_tuple ? "tuple" : "list";
    case Kind::dict: return "dict";
    case Kind::ns: return "Namespace";
    default: return "function";
  }
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) append_utf8(cps[i], out);
  return out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string text(buf), digits;
  bool negative = text[0] == '-';
  size_t e = text.find('e');
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (text[i] != '.') digits += text[i];
  int exponent = std::atoi(text.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string whole = digits.substr(0, std::min<size_t>(digits.size(), exponent + 1));
      whole.append(exponent + 1 - whole.size(), '0');
      std::string fraction = digits.size() > size_t(exponent + 1) ? digits.substr(exponent + 1) : "0";
      return out + whole + "." + fraction;
    }
    return out + "0." + std::string(-exponent - 1, '0') + digits;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_text;
}

static bool printable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR:
    case U_GENERAL_OTHER_TYPES: case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
      return false;
    default: return true;
  }
}

static std::string string_repr(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : code_points(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (printable(cp)) append_utf8(cp, out);
    else {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
  }
  return out + quote;
}

static std::string sequence_repr(const Value& v) {
  ValueDepthGuard guard;
  if (v.is_iterator())
    throw RenderError("printing a " + std::string(v.view) + " object, which Python shows with its memory address");
  if (v.view && std::strcmp(v.view, "range") == 0) return v.string;
  if (v.view) {
    Value plain = v;
    plain.view = nullptr;
    return std::string(v.view) + "(" + sequence_repr(plain) + ")";
  }
  std::string out = v.is_tuple ? "(" : "[";
  for (size_t i = 0; i < v.list->size(); ++i) {
    if (i) out += ", ";
    out += to_repr((*v.list)[i]);
  }
  if (v.is_tuple && v.list->size() == 1) out += ",";
  return out + (v.is_tuple ? ")" : "]");
}

static std::string dict_repr(const Dict& d) {
  ValueDepthGuard guard;
  std::string out = "{";
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(d.items[i].first) + ": " + to_repr(d.items[i].second);
  }
  return out + "}";
}

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Kind::string: return v.is_markup ? "Markup(" + string_repr(v.string) + ")" : string_repr(v.string);
    case Kind::list: return sequence_repr(v);
    case Kind::dict: return dict_repr(*v.dict);
    case Kind::undefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return v.boolean ? "True" : "False";
    case Kind::integer: return std::to_string(v.integer);
    case Kind::floating: return float_repr(v.floating);
    case Kind::string: return v.string;
    case Kind::list: return sequence_repr(v);
    case Kind::dict: return dict_repr(*v.dict);
    case Kind::ns:
      if (v.view && std::strcmp(v.view, "LoopContext") == 0) {
        const Value* index = v.dict->find("index");
        const Value* length = v.dict->find("length");
        return "<LoopContext " + (index ? to_str(*index) : "?") + "/" + (length ? to_str(*length) : "?") + ">";
      }
      return "<Namespace " + dict_repr(*v.dict) + ">";
    default:
      // Python shows a function with its memory address: no text to match.
      throw RenderError("printing a function or macro, which Python shows with its memory address");
  }
}

bool equals(const Value& a, const Value& b) {
  ValueDepthGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::floating && b.kind != Kind::floating)
      return (a.kind == Kind::boolean ? a.boolean : a.integer) == (b.kind == Kind::boolean ? b.boolean : b.integer);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string: return a.string == b.string;
    case Kind::list:
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Kind::dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, value] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(value, *other)) return false;
      }
      return true;
    default: return a.dict == b.dict && a.function == b.function;
  }
}

bool less_than(const Value& a, const Value& b) {
  ValueDepthGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::integer && b.kind == Kind::integer) return a.integer < b.integer;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.string < b.string;  // UTF-8 order is code point order
  if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple && !a.view && !b.view) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (equals((*a.list)[i], (*b.list)[i])) continue;
      return less_than((*a.list)[i], (*b.list)[i]);
    }
    return a.list->size() < b.list->size();
  }
  throw RenderError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

static void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (uint32_t cp : code_points(s)) {
    char buf[16];
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E && cp < 0x10000)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else if (ensure_ascii && cp >= 0x10000) {
      uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      out += buf;
    } else {
      append_utf8(cp, out);
    }
  }
  out += '"';
}

static std::string json_key(const Value& key) {
  switch (key.kind) {
    case Kind::string: return key.string;
    case Kind::none: return "null";
    case Kind::boolean: return key.boolean ? "true" : "false";
    case Kind::integer:
    case Kind::floating: return to_str(key);
    default: throw RenderError("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

static void json_dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out);

static void json_newline(const JsonDumpOptions& o, int depth, std::string& out) {
  if (!o.has_indent) return;
  out += '\n';
  for (int i = 0; i < depth; ++i) out += o.indent;
}

static void json_dump_dict(const Dict& d, const JsonDumpOptions& o, int depth, std::string& out) {
  if (d.items.empty()) {
    out += "{}";
    return;
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  for (const auto& [k, v] : d.items) entries.emplace_back(json_key(k), &v);
  if (o.sort_keys)
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += o.item_separator;
    json_newline(o, depth + 1, out);
    json_string(entries[i].first, o.ensure_ascii, out);
    out += o.key_separator;
    json_dump(*entries[i].second, o, depth + 1, out);
  }
  json_newline(o, depth, out);
  out += '}';
}

static void json_dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  if (depth > 512) throw RenderError("json.dumps: nesting deeper than 512");
  switch (v.kind) {
    case Kind::none: out += "null"; return;
    case Kind::boolean: out += v.boolean ? "true" : "false"; return;
    case Kind::integer: out += std::to_string(v.integer); return;
    case Kind::floating:
      out += std::isnan(v.floating) ? "NaN" : std::isinf(v.floating) ? (v.floating > 0 ? "Infinity" : "-Infinity")
                                                                     : float_repr(v.floating);
      return;
    case Kind::string: json_string(v.string, o.ensure_ascii, out); return;
    case Kind::dict: json_dump_dict(*v.dict, o, depth, out); return;
    case Kind::list:
      if (v.view) throw RenderError("Object of type " + std::string(v.view) + " is not JSON serializable");
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += o.item_separator;
        json_newline(o, depth + 1, out);
        json_dump((*v.list)[i], o, depth + 1, out);
      }
      json_newline(o, depth, out);
      out += ']';
      return;
    default: throw RenderError("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  json_dump(v, options, 0, out);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  ValueDepthGuard guard;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw RenderError("the integer " + j.dump() + " does not fit in 64 bits");  // Python's would; ours refuses
      return Value::from(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::from(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value list = Value::make_list();
      for (const auto& item : j) list.list->push_back(from_json(item));
      list.refresh_nesting();
      return list;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value dict = Value::make_dict();
      for (const auto& [key, item] : j.items()) dict.dict->items.emplace_back(Value::from(key), from_json(item));
      dict.refresh_nesting();
      return dict;
    }
    default: throw std::runtime_error("unsupported JSON value (binary) in template variables");
  }
}

}  // namespace fsdp::text::jinja
