#pragma once
// UTF-8 as Python reads it with errors='replace', and GPT-2's byte-level
// alphabet (each byte one printable character).

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp::text {

/// `text` with each maximal invalid UTF-8 subsequence replaced by U+FFFD, as
/// Python's bytes.decode('utf-8', errors='replace') does; `text` itself when
/// it is valid (the common case costs one scan, no copy into `scratch`).
std::string_view valid_utf8(std::string_view text, std::string& scratch);

/// The length of the valid UTF-8 sequence starting at text[i], or 0 if none
/// (an invalid byte); `invalid_run` then says how many bytes Python replaces
/// by one U+FFFD (1, or the valid prefix of a truncated sequence).
size_t utf8_sequence_length(std::string_view text, size_t i, size_t& invalid_run);

/// The code point of the valid UTF-8 sequence of `length` bytes at text[i].
uint32_t code_point_at(std::string_view text, size_t i, size_t length);

/// The length of the UTF-8 character at text[i] (1 for an invalid byte).
size_t character_length(std::string_view text, size_t i);

/// The code point before text[at] (at > 0, valid UTF-8), and in `begin`
/// where it starts.
uint32_t code_point_before(std::string_view text, size_t at, size_t& begin);

/// GPT-2's bytes_to_unicode: byte b as a code point (printable bytes map to
/// themselves, the others to 256 + k).
const std::array<uint32_t, 256>& byte_to_code_point();

/// A code point's UTF-8 bytes appended to `out`.
void append_utf8(uint32_t code_point, std::string& out);

/// The bytes a byte-level token string stands for: each character mapped
/// back through byte_to_code_point. False (and `out` unspecified) if a
/// character is outside the 256-character alphabet or `token` is not UTF-8.
bool byte_level_to_bytes(std::string_view token, std::string& out);

/// `bytes` as a byte-level token string (the inverse of byte_level_to_bytes).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace fsdp::text
