#pragma once
// Python's str methods on UTF-8 text, code point by code point, as chat
// templates call them (jinja_strings.cpp).

#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace fsdp::text::jinja {

/// Python's str.isspace() of one code point.
bool is_python_space(uint32_t cp);
/// str.strip/lstrip/rstrip: `chars` null strips whitespace.
std::string python_strip(const std::string& s, const std::string* chars, bool left, bool right);
/// str.split(sep, maxsplit) (sep null: runs of whitespace) and rsplit.
std::vector<std::string> python_split(const std::string& s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> python_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit);
/// str.splitlines(keepends=False).
std::vector<std::string> python_splitlines(const std::string& s);
/// str.upper / lower (full Unicode case mapping) / title / capitalize.
std::string python_upper(const std::string& s);
std::string python_lower(const std::string& s);
std::string python_title(const std::string& s);
std::string python_capitalize(const std::string& s);
/// str.replace(old, new, count) (count < 0: all).
std::string python_replace(const std::string& s, const std::string& old_text, const std::string& new_text,
                           int64_t count);
/// `format % args` (Python's printf-style formatting).
std::string percent_format(const std::string& format, const Value& args);
/// str.format(*args, **kwargs) for {} {0} {name} fields with simple specs.
std::string brace_format(const std::string& format, CallArgs& args);
/// markupsafe's escape: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);
/// A method of a str value (`name` of str), bound to it; Undefined if none.
Value string_method(const Value& self, const std::string& name);

}  // namespace fsdp::text::jinja
