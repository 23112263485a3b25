// Python's str methods for the chat template interpreter (see jinja_strings.h).
#include "text/jinja_strings.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "text/jinja_eval.h"

namespace fsdp::text::jinja {

bool is_python_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string python_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = code_points(s), strip_set;
  if (chars) strip_set = code_points(*chars);
  auto strips = [&](uint32_t c) {
    return chars ? std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end() : is_python_space(c);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strips(cps[begin])) ++begin;
  if (right)
    while (end > begin && strips(cps[end - 1])) --end;
  return from_code_points(cps, begin, end);
}

static std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<std::string> out;
  size_t i = 0, n = cps.size();
  for (;;) {
    while (i < n && is_python_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(from_code_points(cps, i, n));  // the rest, trailing whitespace and all
      break;
    }
    size_t start = i;
    while (i < n && !is_python_space(cps[i])) ++i;
    out.push_back(from_code_points(cps, start, i));
  }
  return out;
}

std::vector<std::string> python_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit);
  if (sep->empty()) throw RenderError("empty separator");
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(*sep, start);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) break;
    out.push_back(s.substr(start, at - start));
    start = at + sep->size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::string> python_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return python_split(s, sep, maxsplit);
  if (!sep) {
    // Whitespace rsplit with a limit: split the reversed code points.
    std::vector<uint32_t> cps = code_points(s);
    std::reverse(cps.begin(), cps.end());
    std::vector<std::string> parts = split_whitespace(from_code_points(cps, 0, cps.size()), maxsplit);
    for (auto& p : parts) {
      std::vector<uint32_t> pc = code_points(p);
      std::reverse(pc.begin(), pc.end());
      p = from_code_points(pc, 0, pc.size());
    }
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  if (sep->empty()) throw RenderError("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t at = s.rfind(*sep, end - sep->size());
    if (at == std::string::npos) break;
    out.push_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> python_splitlines(const std::string& s) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                    c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    out.push_back(from_code_points(cps, start, i));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(from_code_points(cps, start, cps.size()));
  return out;
}

static std::string icu_case(const std::string& s, bool upper) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {
    std::string out = s;
    for (char& c : out) c = upper ? static_cast<char>(std::toupper(c)) : static_cast<char>(std::tolower(c));
    return out;
  }
  icu::UnicodeString text = icu::UnicodeString::fromUTF8(s);
  if (upper) text.toUpper(icu::Locale::getRoot());
  else text.toLower(icu::Locale::getRoot());
  std::string out;
  text.toUTF8String(out);
  return out;
}

std::string python_upper(const std::string& s) { return icu_case(s, true); }
std::string python_lower(const std::string& s) { return icu_case(s, false); }

static std::string title_case_char(uint32_t cp) {
  icu::UnicodeString one(static_cast<UChar32>(cp));
  one.toTitle(nullptr, icu::Locale::getRoot(), U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
  std::string out;
  one.toUTF8String(out);
  return out;
}

std::string python_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (uint32_t cp : code_points(s)) {
    bool cased = u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED);
    std::vector<uint32_t> one{cp};
    std::string ch = from_code_points(one, 0, 1);
    out += previous_cased ? python_lower(ch) : (cased ? title_case_char(cp) : ch);
    previous_cased = cased;
  }
  return out;
}

std::string python_capitalize(const std::string& s) {
  std::vector<uint32_t> cps = code_points(s);
  if (cps.empty()) return s;
  return title_case_char(cps[0]) + python_lower(from_code_points(cps, 1, cps.size()));
}

std::string python_replace(const std::string& s, const std::string& old_text, const std::string& new_text,
                           int64_t count) {
  if (old_text.empty()) {
    // Python inserts `new` between characters and at both ends.
    std::vector<uint32_t> cps = code_points(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (i < cps.size()) out += from_code_points(cps, i, i + 1);
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  for (;;) {
    size_t at = s.find(old_text, start);
    if (at == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, start, at - start);
    out += new_text;
    start = at + old_text.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// One %-conversion: flags, width, precision and type already split out.
// Numbers go through printf, whose conversions Python's follow.
static std::string format_one(char type, const std::string& flags, int width, int precision, const Value& v) {
  std::string body;
  char buf[512];
  std::string spec = "%" + flags + (width ? std::to_string(width) : "") +
                     (precision >= 0 ? "." + std::to_string(precision) : "");
  if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o') {
    if (!v.is_number()) throw RenderError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
    long long n = v.kind == Kind::integer ? v.integer : static_cast<long long>(v.as_double());
    std::snprintf(buf, sizeof buf, (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
    return buf;
  }
  if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G') {
    if (!v.is_number()) throw RenderError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
    std::snprintf(buf, sizeof buf, (spec + type).c_str(), v.as_double());
    return buf;
  }
  if (type == 's') body = to_str(v);
  else if (type == 'r' || type == 'a') body = to_repr(v);
  else if (type == 'c') body = v.is_string() ? v.string : from_code_points({static_cast<uint32_t>(v.integer)}, 0, 1);
  else throw RenderError(std::string("unsupported format character '") + type + "'");
  if (precision >= 0) {
    std::vector<uint32_t> cps = code_points(body);
    body = from_code_points(cps, 0, std::min<size_t>(cps.size(), precision));
  }
  int pad = width - static_cast<int>(code_point_count(body));
  if (pad > 0) body = flags.find('-') != std::string::npos ? body + std::string(pad, ' ') : std::string(pad, ' ') + body;
  return body;
}

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> positional;
  // A dict is the mapping of %(name)s fields, or else one value, as in Python;
  // Python never counts the unused arguments of a mapping (nor of a list,
  // which passes its mapping check).
  bool by_name = args.kind == Kind::dict && format.find("%(") != std::string::npos;
  bool indexable_list = args.is_list() && !args.is_tuple && (!args.view || std::string(args.view) == "range");
  bool mapping_like = args.kind == Kind::dict || indexable_list || args.is_undefined();
  if (args.kind == Kind::list && args.is_tuple) positional = *args.list;
  else if (!by_name) positional.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) throw RenderError("incomplete format");
    if (format[i] == '%') {
      out += '%';
      continue;
    }
    const Value* value = nullptr;
    Value keyed;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos || args.kind != Kind::dict) throw RenderError("format requires a mapping");
      const Value* found = args.dict->find(format.substr(i + 1, close - i - 1));
      if (!found) throw RenderError("KeyError: '" + format.substr(i + 1, close - i - 1) + "'");
      keyed = *found;
      value = &keyed;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos) flags += format[i++];
    int width = 0, precision = -1;
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) width = width * 10 + (format[i++] - '0');
    if (i < format.size() && format[i] == '.') {
      precision = 0;
      ++i;
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])))
        precision = precision * 10 + (format[i++] - '0');
    }
    if (i >= format.size()) throw RenderError("incomplete format");
    if (!value) {
      if (next >= positional.size()) throw RenderError("not enough arguments for format string");
      value = &positional[next++];
    }
    out += format_one(format[i], flags, width, precision, *value);
  }
  if (!mapping_like && next < positional.size())
    throw RenderError("not all arguments converted during string formatting");
  return out;
}

std::string brace_format(const std::string& format, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if ((c == '{' || c == '}') && i + 1 < format.size() && format[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    size_t close = format.find('}', i);
    if (close == std::string::npos) throw RenderError("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos)
      throw RenderError("unsupported str.format field '{" + field + "}'");
    const Value* v;
    if (field.empty()) v = args.get_positional(auto_index++);
    else if (field.find_first_not_of("0123456789") == std::string::npos) v = args.get_positional(std::stoul(field));
    else v = args.get_keyword(field);
    if (!v) throw RenderError("str.format: no argument for '{" + field + "}'");
    out += to_str(*v);
    i = close;
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace fsdp::text::jinja
