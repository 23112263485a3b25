// Jinja's lexer with transformers' settings: trim_blocks and lstrip_blocks on,
// keep_trailing_newline off, newlines normalized to "\n" (see jinja_ast.h).
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "text/jinja_ast.h"

namespace fsdp::text::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Jinja reads every line ending as "\n" and, without keep_trailing_newline,
// drops one newline at the very end.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& origin) : src_(normalize_newlines(source)), origin_(origin) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(origin_ + ":" + std::to_string(line_) + ": " + what);
  }
  void emit(TokenType type, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }
  void skip_whitespace_after(size_t from) {
    size_t to = from;
    while (to < src_.size() && is_space(src_[to])) ++to;
    advance_to(to);
  }
  void emit_text(std::string text, char strip_sign, bool is_block_or_comment);
  bool try_raw_block(size_t tag_start);
  void lex_comment(size_t tag_start);
  void lex_tag(size_t tag_start, bool is_block);
  bool try_tag_end(bool is_block);
  void lex_expression_token();
  void lex_number();
  void lex_string();

  std::string src_;
  const std::string& origin_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the text so far ends a line (Jinja's lstrip_blocks condition)
  int bracket_depth_ = 0;
  std::vector<Token> tokens_;
};

// The text before a tag: '-' strips its trailing whitespace; before {% and {#,
// lstrip_blocks removes spaces and tabs that are all the tag's line holds.
void Lexer::emit_text(std::string text, char strip_sign, bool is_block_or_comment) {
  if (strip_sign == '-') {
    while (!text.empty() && is_space(text.back())) text.pop_back();
  } else if (strip_sign != '+' && is_block_or_comment) {
    size_t line_begin = text.rfind('\n');
    line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
    if (line_begin > 0 || line_starting_) {
      bool only_blanks = text.find_first_not_of(" \t", line_begin) == std::string::npos;
      if (only_blanks) text.resize(line_begin);
    }
  }
  if (!text.empty()) {
    Token t;
    t.type = TokenType::text;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
}

std::vector<Token> Lexer::run() {
  while (pos_ < src_.size()) {
    size_t tag = src_.find('{', pos_);
    while (tag != std::string::npos && tag + 1 < src_.size() && src_[tag + 1] != '{' && src_[tag + 1] != '%' &&
           src_[tag + 1] != '#')
      tag = src_.find('{', tag + 1);
    if (tag == std::string::npos || tag + 1 >= src_.size()) {
      emit_text(src_.substr(pos_), 0, false);
      advance_to(src_.size());
      break;
    }
    char kind = src_[tag + 1];
    char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    if (sign != '-' && sign != '+') sign = 0;
    if (sign == '+' && kind == '{') sign = 0;  // {{+ is not a strip sign
    std::string text = src_.substr(pos_, tag - pos_);
    int text_line = line_;
    advance_to(tag);
    std::swap(text_line, line_);
    emit_text(std::move(text), sign, kind != '{');
    std::swap(text_line, line_);
    if (kind == '#') lex_comment(tag);
    else if (kind == '%' && try_raw_block(tag)) continue;
    else lex_tag(tag, kind == '%');
  }
  emit(TokenType::end, "");
  return std::move(tokens_);
}

void Lexer::lex_comment(size_t tag_start) {
  size_t end = src_.find("#}", tag_start + 2);
  if (end == std::string::npos) fail("a comment {# ... is never closed by #}");
  char sign = end > tag_start + 2 ? src_[end - 1] : 0;
  advance_to(end + 2);
  if (sign == '-') skip_whitespace_after(pos_);
  else if (sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);  // trim_blocks
  line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
}

// "{% raw %}...{% endraw %}": its content is text, as written.
bool Lexer::try_raw_block(size_t tag_start) {
  size_t i = tag_start + 2;
  if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
  while (i < src_.size() && is_space(src_[i])) ++i;
  if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i + 3])) ||
                                                                  src_[i + 3] == '_')))
    return false;
  i += 3;
  while (i < src_.size() && is_space(src_[i])) ++i;
  bool strip_after = i < src_.size() && src_[i] == '-';
  if (strip_after) ++i;
  if (src_.compare(i, 2, "%}") != 0) fail("expected %} after {% raw");
  advance_to(i + 2);
  if (strip_after) skip_whitespace_after(pos_);
  for (size_t search = pos_;;) {
    size_t end_tag = src_.find("{%", search);
    if (end_tag == std::string::npos) fail("{% raw %} is never closed by {% endraw %}");
    size_t j = end_tag + 2;
    char sign = (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) ? src_[j++] : 0;
    while (j < src_.size() && is_space(src_[j])) ++j;
    if (src_.compare(j, 6, "endraw") != 0) {
      search = end_tag + 2;
      continue;
    }
    j += 6;
    while (j < src_.size() && is_space(src_[j])) ++j;
    char end_sign = (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) ? src_[j++] : 0;
    if (src_.compare(j, 2, "%}") != 0) fail("expected %} after {% endraw");
    line_starting_ = false;
    emit_text(src_.substr(pos_, end_tag - pos_), sign, true);
    advance_to(j + 2);
    if (end_sign == '-') skip_whitespace_after(pos_);
    else if (end_sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
    return true;
  }
}

void Lexer::lex_tag(size_t tag_start, bool is_block) {
  emit(is_block ? TokenType::block_begin : TokenType::variable_begin, "");
  advance_to(tag_start + 2);
  if (pos_ < src_.size() && (src_[pos_] == '-' || (is_block && src_[pos_] == '+'))) advance_to(pos_ + 1);
  bracket_depth_ = 0;
  for (;;) {
    while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
    if (pos_ >= src_.size()) fail(std::string("a tag ") + (is_block ? "{%" : "{{") + " is never closed");
    if (bracket_depth_ == 0 && try_tag_end(is_block)) break;
    lex_expression_token();
  }
  line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
}

bool Lexer::try_tag_end(bool is_block) {
  const char* close = is_block ? "%}" : "}}";
  char sign = 0;
  size_t at = pos_;
  if ((src_[at] == '-' || (is_block && src_[at] == '+')) && src_.compare(at + 1, 2, close) == 0) sign = src_[at++];
  if (src_.compare(at, 2, close) != 0) return false;
  emit(is_block ? TokenType::block_end : TokenType::variable_end, "");
  advance_to(at + 2);
  if (sign == '-') skip_whitespace_after(pos_);
  else if (is_block && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);  // trim_blocks
  return true;
}

void Lexer::lex_expression_token() {
  char c = src_[pos_];
  if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
    size_t end = pos_;
    while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    emit(TokenType::name, src_.substr(pos_, end - pos_));
    advance_to(end);
  } else if (std::isdigit(static_cast<unsigned char>(c))) {
    lex_number();
  } else if (c == '\'' || c == '"') {
    lex_string();
  } else {
    static const char* two_char[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two_char)
      if (src_.compare(pos_, 2, op) == 0) {
        emit(TokenType::op, op);
        advance_to(pos_ + 2);
        return;
      }
    if (std::string("+-*/%~()[]{},.:|=<>").find(c) == std::string::npos)
      fail(std::string("unexpected character '") + c + "' in a tag");
    if (c == '(' || c == '[' || c == '{') ++bracket_depth_;
    if ((c == ')' || c == ']' || c == '}') && bracket_depth_ > 0) --bracket_depth_;
    emit(TokenType::op, std::string(1, c));
    advance_to(pos_ + 1);
  }
}

void Lexer::lex_number() {
  size_t end = pos_;
  auto digits = [&](size_t& i) {
    while (i < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[i])) || src_[i] == '_')) ++i;
  };
  if (src_[pos_] == '0') {
    // Jinja's integers have no leading zeros: "012" is 0 then 12, which the parser refuses.
    while (end < src_.size() && (src_[end] == '0' || src_[end] == '_')) ++end;
  } else {
    digits(end);
  }
  bool is_float = false;
  if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
    ++end;
    digits(end);
    is_float = true;
  }
  if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
    size_t exp = end + 1;
    if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
    if (exp < src_.size() && std::isdigit(static_cast<unsigned char>(src_[exp]))) {
      end = exp;
      digits(end);
      is_float = true;
    }
  }
  std::string text;
  for (size_t i = pos_; i < end; ++i)
    if (src_[i] != '_') text += src_[i];
  Token t;
  t.type = is_float ? TokenType::floating : TokenType::integer;
  t.line = line_;
  t.text = text;
  if (is_float) t.floating = std::strtod(text.c_str(), nullptr);
  else t.integer = std::strtoll(text.c_str(), nullptr, 10);
  tokens_.push_back(std::move(t));
  advance_to(end);
}

void Lexer::lex_string() {
  char quote = src_[pos_];
  std::string value;
  size_t i = pos_ + 1;
  for (;; ++i) {
    if (i >= src_.size()) fail("a string literal is never closed");
    char c = src_[i];
    if (c == quote) break;
    if (c != '\\' || i + 1 >= src_.size()) {
      value += c;
      continue;
    }
    char e = src_[++i];
    switch (e) {
      case 'n': value += '\n'; break;
      case 't': value += '\t'; break;
      case 'r': value += '\r'; break;
      case '0': value += '\0'; break;
      case 'a': value += '\a'; break;
      case 'b': value += '\b'; break;
      case 'f': value += '\f'; break;
      case 'v': value += '\v'; break;
      case '\\': case '\'': case '"': value += e; break;
      case '\n': break;
      case 'x': case 'u': case 'U': {
        size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        std::string hex = src_.substr(i + 1, width);
        if (hex.size() != width || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          fail(std::string("a malformed \\") + e + " escape in a string literal");
        std::vector<uint32_t> cp{static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16))};
        value += from_code_points(cp, 0, 1);
        i += width;
        break;
      }
      default: value += '\\'; value += e;
    }
  }
  emit(TokenType::string, value);
  advance_to(i + 1);
}

}  // namespace

std::vector<Token> tokenize_template(const std::string& source, const std::string& origin) {
  return Lexer(source, origin).run();
}

}  // namespace fsdp::text::jinja
