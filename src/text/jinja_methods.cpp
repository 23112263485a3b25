// Attributes, items, methods, operators and globals of the chat template
// interpreter, with Python's and Jinja's sandboxed semantics (see jinja_eval.h).
#include <set>

#include <unicode/uchar.h>

#include "text/jinja_eval.h"
#include "text/jinja_strings.h"

namespace fsdp::text::jinja {
namespace {

int64_t expect_int(const Value* v, const std::string& what) {
  if (!v) throw RenderError(what + ": a required argument is missing");
  if (v->kind == Kind::integer) return v->integer;
  if (v->kind == Kind::boolean) return v->boolean;
  throw RenderError(what + ": expected an integer, found " + type_name(*v));
}

const std::string& expect_string(const Value* v, const std::string& what) {
  if (!v) throw RenderError(what + ": a required argument is missing");
  if (!v->is_string()) throw RenderError(what + ": expected a str, found " + type_name(*v));
  return v->string;
}

Value string_list(const std::vector<std::string>& parts) {
  Value list = Value::make_list();
  for (const auto& p : parts) list.list->push_back(Value::from(p));
  return list;
}

// Python's slice indices for a sequence of `n` items.
std::vector<size_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step) {
  int64_t st = step && !step->is_none() ? expect_int(step, "slice step") : 1;
  if (st == 0) throw RenderError("slice step cannot be zero");
  auto clamp = [&](const Value* v, int64_t fallback) {
    if (!v || v->is_none()) return fallback;
    int64_t i = expect_int(v, "slice index");
    if (i < 0) i += n;
    if (st > 0) return std::min(std::max<int64_t>(i, 0), n);
    return std::min(std::max<int64_t>(i, -1), n - 1);
  };
  int64_t begin = clamp(start, st > 0 ? 0 : n - 1), end = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = begin; st > 0 ? i < end : i > end; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

bool starts_or_ends(const std::string& s, const Value& affixes, bool at_start) {
  std::vector<Value> options = affixes.is_list() ? *affixes.list : std::vector<Value>{affixes};
  for (const Value& option : options) {
    const std::string& a = expect_string(&option, at_start ? "startswith" : "endswith");
    if (a.size() <= s.size() && s.compare(at_start ? 0 : s.size() - a.size(), a.size(), a) == 0) return true;
  }
  return false;
}

// str.find / rfind / index / count on code points.
Value string_search(const std::string& self, const std::string& method, CallArgs& args) {
  const std::string& needle = expect_string(args.get(0, "sub"), method);
  args.expect_all_used(method);
  if (method == "count") {
    if (needle.empty()) return Value::from(static_cast<int64_t>(code_point_count(self) + 1));
    int64_t n = 0;
    for (size_t at = self.find(needle); at != std::string::npos; at = self.find(needle, at + needle.size())) ++n;
    return Value::from(n);
  }
  size_t at = method == "rfind" || method == "rindex" ? self.rfind(needle) : self.find(needle);
  if (at == std::string::npos) {
    if (method == "index" || method == "rindex") throw RenderError("substring not found");
    return Value::from(-1);
  }
  return Value::from(static_cast<int64_t>(code_point_count(self.substr(0, at))));
}

Value string_predicate(const std::string& s, const std::string& method) {
  std::vector<uint32_t> cps = code_points(s);
  if (cps.empty()) return Value::from(false);
  bool any_cased = false;
  for (uint32_t c : cps) {
    UChar32 u = static_cast<UChar32>(c);
    bool ok = method == "isdigit" ? u_isdigit(u) : method == "isalpha" ? u_isalpha(u)
            : method == "isalnum" ? u_isalnum(u) : method == "isspace" ? is_python_space(c)
            : method == "isnumeric" ? u_isdigit(u) : method == "isdecimal" ? u_isdigit(u)
            : method == "isupper" ? !u_islower(u) : !u_isupper(u);
    if (!ok) return Value::from(false);
    if (u_isupper(u) || u_islower(u)) any_cased = true;
  }
  if (method == "isupper" || method == "islower") return Value::from(any_cased);
  return Value::from(true);
}

Value call_string_method(const std::string& self, const std::string& method, CallArgs& args) {
  auto optional_string = [&](size_t pos, const char* name) -> const std::string* {
    const Value* v = args.get(pos, name);
    if (!v || v->is_none()) return nullptr;
    return &expect_string(v, method);
  };
  auto finish = [&](Value v) {
    args.expect_all_used(method);
    return v;
  };
  if (method == "strip" || method == "lstrip" || method == "rstrip") {
    const std::string* chars = optional_string(0, "chars");
    return finish(Value::from(python_strip(self, chars, method != "rstrip", method != "lstrip")));
  }
  if (method == "split" || method == "rsplit") {
    const std::string* sep = optional_string(0, "sep");
    const Value* max = args.get(1, "maxsplit");
    int64_t maxsplit = max ? expect_int(max, method) : -1;
    return finish(string_list(method == "split" ? python_split(self, sep, maxsplit) : python_rsplit(self, sep, maxsplit)));
  }
  if (method == "splitlines") return finish(string_list(python_splitlines(self)));
  if (method == "startswith" || method == "endswith") {
    const Value* affix = args.get(0, "prefix");
    if (!affix) throw RenderError(method + "() takes at least 1 argument (0 given)");
    return finish(Value::from(starts_or_ends(self, *affix, method == "startswith")));
  }
  if (method == "upper") return finish(Value::from(python_upper(self)));
  if (method == "lower" || method == "casefold") return finish(Value::from(python_lower(self)));
  if (method == "title") return finish(Value::from(python_title(self)));
  if (method == "capitalize") return finish(Value::from(python_capitalize(self)));
  if (method == "replace") {
    const std::string& old_text = expect_string(args.get(0, "old"), method);
    const std::string& new_text = expect_string(args.get(1, "new"), method);
    const Value* count = args.get(2, "count");
    return finish(Value::from(python_replace(self, old_text, new_text, count ? expect_int(count, method) : -1)));
  }
  if (method == "find" || method == "rfind" || method == "index" || method == "rindex" || method == "count")
    return string_search(self, method, args);
  if (method == "format") return Value::from(brace_format(self, args));
  if (method == "join") {
    const Value* items = args.get(0, "iterable");
    if (!items) throw RenderError("join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items)) {
      if (!first) out += self;
      out += expect_string(&item, "join");
      first = false;
    }
    return finish(Value::from(out));
  }
  if (method == "removeprefix" || method == "removesuffix") {
    const std::string& affix = expect_string(args.get(0, "affix"), method);
    bool prefix = method == "removeprefix";
    if (affix.size() <= self.size() && self.compare(prefix ? 0 : self.size() - affix.size(), affix.size(), affix) == 0)
      return finish(Value::from(prefix ? self.substr(affix.size()) : self.substr(0, self.size() - affix.size())));
    return finish(Value::from(self));
  }
  if (method.rfind("is", 0) == 0) return finish(string_predicate(self, method));
  throw RenderError("unsupported str method '" + method + "'");
}

const std::set<std::string>& string_methods() {
  static const std::set<std::string> names = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
      "casefold", "title", "capitalize", "replace", "find", "rfind", "index", "rindex", "count", "format", "join",
      "removeprefix", "removesuffix", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "isnumeric",
      "isdecimal"};
  return names;
}

// Methods the sandbox refuses because they change a list or a dict in place.
bool mutates(const Value& obj, const std::string& name) {
  static const std::set<std::string> list_mutators = {"append", "clear", "extend", "insert", "pop", "remove",
                                                      "reverse", "sort"};
  static const std::set<std::string> dict_mutators = {"clear", "pop", "popitem", "setdefault", "update"};
  return (obj.is_list() && !obj.is_tuple && !obj.view && list_mutators.count(name)) ||
         (obj.is_dict() && dict_mutators.count(name));
}

Value dict_view(const Dict& d, const char* which) {
  std::vector<Value> items;
  for (const auto& [k, v] : d.items) {
    if (which[5] == 'i') items.push_back(Value::make_tuple({k, v}));
    else items.push_back(which[5] == 'k' ? k : v);
  }
  return Value::make_view(std::move(items), which);
}

Value dict_method(const Value& self, const std::string& name) {
  auto dict = self.dict;
  if (name == "items" || name == "keys" || name == "values") {
    const char* view = name == "items" ? "dict_items" : name == "keys" ? "dict_keys" : "dict_values";
    return Value::make_function([dict, view, name](CallArgs& args) {
      args.expect_all_used(name);
      return dict_view(*dict, view);
    });
  }
  if (name == "get")
    return Value::make_function([dict](CallArgs& args) {
      const Value* key = args.get(0, "key");
      if (!key) throw RenderError("get expected at least 1 argument, got 0");
      const Value* fallback = args.get(1, "default");
      args.expect_all_used("get");
      const Value* found = dict->find(*key);
      return found ? *found : fallback ? *fallback : Value::none();
    });
  if (name == "copy")
    return Value::make_function([dict](CallArgs&) {
      Value copy = Value::make_dict();
      *copy.dict = *dict;
      copy.refresh_nesting();
      return copy;
    });
  return Value::undefined("'dict object' has no attribute '" + name + "'");
}

}  // namespace

[[noreturn]] void fail_undefined(const Value& v) {
  throw RenderError(v.string.empty() ? "an undefined value was used" : v.string);
}

// Markup's methods return Markup, after escaping their string arguments.
Value markup_result(Value result) {
  if (result.is_string()) result.is_markup = true;
  if (result.is_list())
    for (Value& item : *result.list)
      if (item.is_string()) item.is_markup = true;
  return result;
}

Value string_method(const Value& self, const std::string& name) {
  if (!string_methods().count(name)) return Value::undefined("'str object' has no attribute '" + name + "'");
  std::string text = self.string;
  if (!self.is_markup)
    return Value::make_function([text, name](CallArgs& args) { return call_string_method(text, name, args); });
  return Value::make_function([text, name](CallArgs& args) {
    for (Value& a : args.positional)
      if (a.is_string() && !a.is_markup) a.string = html_escape(a.string);
    for (auto& kv : args.keywords)
      if (kv.second.is_string() && !kv.second.is_markup) kv.second.string = html_escape(kv.second.string);
    Value result = call_string_method(text, name, args);
    return result.kind == Kind::boolean || result.kind == Kind::integer ? result : markup_result(result);
  });
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (mutates(obj, name))
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
  switch (obj.kind) {
    case Kind::dict: {
      static const std::set<std::string> methods = {"items", "keys", "values", "get", "copy"};
      if (methods.count(name)) return dict_method(obj, name);
      const Value* found = obj.dict->find(name);
      return found ? *found : Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::ns: {
      const Value* found = obj.dict->find(name);
      return found ? *found : Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Kind::string: return string_method(obj, name);
    case Kind::list:
      if ((name == "index" || name == "count") && !obj.view) {
        auto list = obj.list;
        return Value::make_function([list, name](CallArgs& args) {
          const Value* x = args.get(0, "value");
          if (!x) throw RenderError(name + "() takes exactly one argument (0 given)");
          int64_t n = 0;
          for (size_t i = 0; i < list->size(); ++i)
            if (equals((*list)[i], *x)) {
              if (name == "index") return Value::from(static_cast<int64_t>(i));
              ++n;
            }
          if (name == "index") throw RenderError(to_repr(*x) + " is not in list");
          return Value::from(n);
        });
      }
      [[fallthrough]];
    default: return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    const Value* found = obj.dict->find(key);
    if (found) return *found;
    if (key.is_string()) return get_attribute(obj, key.string);
    return Value::undefined("'dict object' has no attribute " + to_repr(key));
  }
  bool indexable = (obj.is_list() && (!obj.view || std::string(obj.view) == "range")) || obj.is_string();
  if (indexable && (key.kind == Kind::integer || key.kind == Kind::boolean)) {
    int64_t i = key.kind == Kind::integer ? key.integer : key.boolean;
    if (obj.is_string()) {
      std::vector<uint32_t> cps = code_points(obj.string);
      int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("string index out of range");
      Value character = Value::from(from_code_points(cps, i, i + 1));
      character.is_markup = obj.is_markup;
      return character;
    }
    int64_t n = static_cast<int64_t>(obj.list->size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(type_name(obj) + " object has no element " + std::to_string(i));
    return (*obj.list)[i];
  }
  if (key.is_string()) return get_attribute(obj, key.string);
  return Value::undefined("'" + type_name(obj) + " object' has no attribute " + to_repr(key));
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    std::vector<uint32_t> cps = code_points(obj.string);
    std::string out;
    for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step))
      out += from_code_points(cps, i, i + 1);
    Value sliced = Value::from(out);
    sliced.is_markup = obj.is_markup;
    return sliced;
  }
  if (obj.is_list() && !obj.view) {
    std::vector<Value> items;
    for (size_t i : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step))
      items.push_back((*obj.list)[i]);
    return obj.is_tuple ? Value::make_tuple(std::move(items)) : Value::make_list(std::move(items));
  }
  // Jinja slices with Python's own [], not its forgiving getitem: anything else raises.
  throw RenderError("'" + type_name(obj) + "' object cannot be sliced here (Python: not subscriptable)");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return {};
    case Kind::list: return *v.list;
    case Kind::dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::string: {
      std::vector<uint32_t> cps = code_points(v.string);
      std::vector<Value> chars;
      for (size_t i = 0; i < cps.size(); ++i) chars.push_back(Value::from(from_code_points(cps, i, i + 1)));
      return chars;
    }
    default: throw RenderError("'" + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string())
      throw RenderError("'in <string>' requires string as left operand, not " + type_name(needle));
    return haystack.string.find(needle.string) != std::string::npos;
  }
  if (haystack.is_dict()) {
    if ((needle.is_list() && !needle.is_tuple) || needle.is_dict() || needle.kind == Kind::ns)
      throw RenderError("unhashable type: '" + type_name(needle) + "'");
    return haystack.dict->find(needle) != nullptr;
  }
  if (haystack.is_list()) {
    for (const Value& item : *haystack.list)
      if (equals(item, needle)) return true;
    return false;
  }
  if (haystack.is_undefined()) return false;
  throw RenderError("argument of type '" + type_name(haystack) + "' is not iterable");
}

Value call_value(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.kind != Kind::function) throw RenderError("'" + type_name(callee) + "' object is not callable");
  return (*callee.function)(args);
}

}  // namespace fsdp::text::jinja
