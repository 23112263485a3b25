#pragma once
// Hugging Face pre-tokenizers for byte-level BPE: Split(Regex, Isolated) and
// ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), in sequence.
// Regexes are Oniguruma's, as in the `tokenizers` package.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::text {

/// GPT-2's pre-tokenization pattern (ByteLevel with use_regex true).
extern const char* const kGpt2Pattern;

/// A compiled Oniguruma regex (UTF-8); its searches may run on several threads.
class Regex {
 public:
  /// Throws std::runtime_error with Oniguruma's message if `pattern` does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// The first match at or after `from`: true and [begin, end), or false.
  bool search(std::string_view text, size_t from, size_t& begin, size_t& end) const;

 private:
  void* regex_ = nullptr;  // OnigRegex
};

/// The pieces a text splits into before BPE (raw bytes; the byte-level
/// mapping is implicit: BPE starts from each byte's token).
class PreTokenizer {
 public:
  /// Appends Split(pattern) with the Isolated behaviour: matches and the
  /// text between them are pieces.
  void add_split(const std::string& pattern);
  /// Appends ByteLevel: a space before each piece not starting with one if
  /// add_prefix_space; GPT-2's split if use_regex.
  void add_byte_level(bool add_prefix_space, bool use_regex);
  /// Calls `emit` with each piece of `text` (valid UTF-8), in order.
  void for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  struct Step {
    std::shared_ptr<Regex> regex;  // null: no split
    bool add_prefix_space = false;
  };
  void apply(size_t step, std::string_view piece, const std::function<void(std::string_view)>& emit) const;
  std::vector<Step> steps_;
};

}  // namespace fsdp::text
