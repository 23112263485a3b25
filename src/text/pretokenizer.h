#pragma once
// Hugging Face pre-tokenizers: Split(Regex, Isolated), ByteLevel
// (add_prefix_space, use_regex with GPT-2's pattern) and Metaspace
// (SentencePiece's "▁" for spaces), in sequence.
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
///
/// Every search is bounded: a pattern that backtracks catastrophically
/// (nested quantifiers, `(a+)+$`) would otherwise run for the age of the
/// universe on a text of a few dozen bytes. Past the bound a search throws,
/// naming the pattern, instead of spinning or (as Oniguruma's own error code
/// would be read) silently finding no match.
class Regex {
 public:
  /// Oniguruma's own default bound on one match attempt (backtracking steps);
  /// real pre-tokenizer patterns take a few dozen a piece.
  static constexpr unsigned long kDefaultStepsPerMatch = 10'000'000;
  /// Throws std::runtime_error with Oniguruma's message if `pattern` does not
  /// compile. `steps_per_match` bounds one match attempt, `steps_per_search`
  /// (0: none) a whole search over every start position.
  explicit Regex(const std::string& pattern, unsigned long steps_per_match = kDefaultStepsPerMatch,
                 unsigned long steps_per_search = 0);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// The first match at or after `from`: true and [begin, end), or false.
  /// Throws std::runtime_error naming the pattern where the search exceeds its bound.
  bool search(std::string_view text, size_t from, size_t& begin, size_t& end) const;
  /// Whether the pattern matches anywhere in `text` (search from 0).
  bool found_in(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  void* regex_ = nullptr;  // OnigRegex
  std::string pattern_;
  unsigned long steps_per_match_, steps_per_search_;
};

/// When Metaspace puts its replacement before a piece that does not start
/// with it: always, only at the start of the text, or never (the
/// `tokenizers` package's prepend_scheme always / first / never).
enum class MetaspacePrepend { kAlways, kFirst, kNever };

/// The pieces a text splits into before BPE (raw bytes; the byte-level
/// mapping is implicit: BPE starts from each byte's token).
class PreTokenizer {
 public:
  /// Where a piece handed to for_each_piece stands: at the start of the
  /// text, a piece of its own elsewhere (after an added token), or
  /// continuing text encoded before (no prefix space, no Metaspace prepend).
  enum class Start { kText, kPiece, kContinued };
  /// Appends Split(pattern) with the Isolated behaviour: matches and the
  /// text between them are pieces.
  void add_split(const std::string& pattern);
  /// Appends ByteLevel: a space before each piece not starting with one if
  /// add_prefix_space; GPT-2's split if use_regex.
  void add_byte_level(bool add_prefix_space, bool use_regex);
  /// Appends Metaspace: each space becomes `replacement`, which `prepend`
  /// puts before a piece not starting with it; if `split`, a piece is cut
  /// before each replacement (the `tokenizers` package's MergedWithNext).
  void add_metaspace(const std::string& replacement, MetaspacePrepend prepend, bool split);
  /// Whether a ByteLevel step is in the sequence.
  bool has_byte_level() const;
  /// Whether a Metaspace step turns spaces into `replacement`.
  bool replaces_spaces_with(std::string_view replacement) const;
  /// Whether a Metaspace step with MetaspacePrepend other than kNever is.
  bool prepends_metaspace() const;
  /// Calls `emit` with each piece of `text` (valid UTF-8), in order.
  void for_each_piece(std::string_view text, Start start, const std::function<void(std::string_view)>& emit) const;

 private:
  struct Step {
    std::shared_ptr<Regex> regex;  // null: no split
    bool add_prefix_space = false;
    bool byte_level = false;
    std::string metaspace;  // Metaspace's replacement; empty: not a Metaspace step
    MetaspacePrepend prepend = MetaspacePrepend::kNever;
    bool metaspace_split = false;
  };
  void apply(size_t step, std::string_view piece, Start start, const std::function<void(std::string_view)>& emit) const;
  void apply_metaspace(size_t step, std::string_view piece, Start start,
                       const std::function<void(std::string_view)>& emit) const;
  std::vector<Step> steps_;
};

}  // namespace fsdp::text
