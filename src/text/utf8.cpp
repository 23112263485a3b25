#include "text/utf8.h"

#include <unordered_map>

namespace fsdp::text {

namespace {

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The allowed range of the second byte after lead byte `lead` (Unicode's
// table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
void second_byte_range(unsigned char lead, unsigned char& low, unsigned char& high) {
  low = 0x80;
  high = 0xBF;
  if (lead == 0xE0) low = 0xA0;
  else if (lead == 0xED) high = 0x9F;
  else if (lead == 0xF0) low = 0x90;
  else if (lead == 0xF4) high = 0x8F;
}

}  // namespace

size_t utf8_sequence_length(std::string_view text, size_t i, size_t& invalid_run) {
  const auto lead = static_cast<unsigned char>(text[i]);
  invalid_run = 1;
  if (lead < 0x80) return 1;
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4;
  else return 0;
  unsigned char low, high;
  second_byte_range(lead, low, high);
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= text.size()) { invalid_run = k; return 0; }
    const auto c = static_cast<unsigned char>(text[i + k]);
    const bool ok = k == 1 ? (c >= low && c <= high) : continuation(c);
    // Python replaces the valid prefix read so far with one U+FFFD and
    // starts again at the byte that broke it.
    if (!ok) { invalid_run = k; return 0; }
  }
  return length;
}

uint32_t code_point_at(std::string_view text, size_t i, size_t length) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(text[i + k])); };
  if (length == 1) return byte(0);
  uint32_t cp = byte(0) & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) cp = (cp << 6) | (byte(k) & 0x3F);
  return cp;
}

size_t character_length(std::string_view text, size_t i) {
  size_t invalid_run = 0;
  const size_t length = utf8_sequence_length(text, i, invalid_run);
  return length ? length : 1;
}

uint32_t code_point_before(std::string_view text, size_t at, size_t& begin) {
  begin = at - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return code_point_at(text, begin, at - begin);
}

std::string_view valid_utf8(std::string_view text, std::string& scratch) {
  size_t i = 0, run = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) { ++i; continue; }
    const size_t n = utf8_sequence_length(text, i, run);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return text;
  scratch.assign(text.data(), i);
  while (i < text.size()) {
    const size_t n = utf8_sequence_length(text, i, run);
    if (n == 0) {
      scratch += "\xEF\xBF\xBD";
      i += run;
    } else {
      scratch.append(text.data() + i, n);
      i += n;
    }
  }
  return scratch;
}

const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  static const std::unordered_map<uint32_t, unsigned char> code_point_to_byte = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    for (uint32_t b = 0; b < 256; ++b) m[byte_to_code_point()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  out.clear();
  size_t i = 0, run = 0;
  while (i < token.size()) {
    const size_t n = utf8_sequence_length(token, i, run);
    if (n == 0) return false;
    auto c = static_cast<uint32_t>(static_cast<unsigned char>(token[i]));
    if (n > 1) {
      c &= (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
    }
    const auto found = code_point_to_byte.find(c);
    if (found == code_point_to_byte.end()) return false;
    out += static_cast<char>(found->second);
    i += n;
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) append_utf8(byte_to_code_point()[static_cast<unsigned char>(b)], out);
  return out;
}

}  // namespace fsdp::text
