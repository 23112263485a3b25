#pragma once
/// \file
/// BPE tokenizers in the Hugging Face `tokenizer.json` format: byte-level
/// (GPT-2's, Llama 3's, Qwen's family) and SentencePiece-style (Llama 2's,
/// Mistral's, TinyLlama's, Phi-3's: "▁" for spaces, byte fallback): reading,
/// encoding, decoding, and a byte-level trainer that writes one. Free of
/// LibTorch (library target fsdp_text).
///
/// Text that is not valid UTF-8 is encoded as Python's
/// bytes.decode('utf-8', errors='replace') would read it: each maximal
/// invalid subsequence becomes U+FFFD (bytes EF BF BD) before tokenizing.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::text {

/// The ids a tokenizer.json may give are below this (2^24 = 16,777,216, 64
/// times the largest vocabularies on the hub): the id tables are indexed by
/// id, so a larger one would be what they allocate.
constexpr uint64_t kMaxTokenIds = uint64_t{1} << 24;

/// A Hugging Face tokenizer.json with a BPE model (merges as "a b" strings or
/// [a, b] pairs, ignore_merges), one of two kinds, told by the decoder:
///  - byte-level (decoder ByteLevel or null): pre-tokenizer ByteLevel or a
///    Sequence of Split(Regex) and ByteLevel(use_regex false), normalizer
///    null or NFC;
///  - SentencePiece-style (decoder Sequence of Replace, ByteFallback, Fuse,
///    Strip, or Metaspace): BPE over characters with byte_fallback (a
///    character outside the vocabulary becomes the `<0xNN>` tokens of its
///    UTF-8 bytes), unk_token and fuse_unk; pre-tokenizer Metaspace or null;
///    normalizer a Sequence of Prepend, Replace (a string) and NFC.
/// Added tokens are matched literally (lstrip, rstrip and single_word as
/// the `tokenizers` package applies them); the post-processor (TemplateProcessing,
/// ByteLevel, Bert/RobertaProcessing) is read for the ids it adds around a
/// text (template_prefix_ids, template_suffix_ids). Others are refused.
/// Immutable after construction: encode and decode may run on several
/// threads at once.
class Tokenizer {
 public:
  /// Reads the file. Throws std::runtime_error naming the file and what is
  /// missing or unsupported (another model type, a normalizer, pre-tokenizer,
  /// decoder or post-processor outside those above, byte_fallback with a
  /// ByteLevel decoder), or an id that is not a whole number below kMaxTokenIds.
  explicit Tokenizer(const std::string& tokenizer_json_path);
  /// Frees the tokenizer.
  ~Tokenizer();
  /// Moves the tokenizer (copying is not supported).
  Tokenizer(Tokenizer&&) noexcept;
  /// Moves the tokenizer (copying is not supported).
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// The ids the `tokenizers` package's encode(text, add_special_tokens=False).ids
  /// gives for `text` read as UTF-8 with errors='replace'.
  std::vector<uint32_t> encode(std::string_view text) const;
  /// The ids of `text` where it continues a text whose start was encoded
  /// before, cut at restart_point: what a text gets only at its start (the
  /// "▁" of a Prepend normalizer or of a Metaspace pre-tokenizer, ByteLevel's
  /// prefix space) is not added before its first added token.
  std::vector<uint32_t> encode_continuation(std::string_view text) const;
  /// The last position p in (0, limit] at which encode(text) equals
  /// encode(text[:p]) followed by encode_continuation(text[p:]) for any text
  /// that follows, as far as the pre-tokenizer, the vocabulary and the added
  /// tokens tell: before " word" after a visible ASCII character, or
  /// (byte-level files) after a newline between two visible ASCII
  /// characters; never inside an added token or right after one with
  /// rstrip. 0 if there is none.
  size_t restart_point(std::string_view text, size_t limit) const;
  /// The text of `ids` as the `tokenizers` package's decode gives it (special
  /// tokens kept), but in raw bytes: a byte token run that is not UTF-8 is
  /// given as its bytes, not as U+FFFD; the text may end in (or hold) partial
  /// UTF-8 sequences. Throws for an id outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& ids) const;
  /// The text of `ids` that continue ids decoded before: without what the
  /// decoder does only at the start of a text (the Strip of one leading
  /// space, Metaspace's dropped first "▁"), so decode(a) followed by
  /// decode_continuation(b) equals decode(a + b).
  std::string decode_continuation(const std::vector<uint32_t>& ids) const;
  /// The ids the file's post-processor puts before a single text (Llama 2's
  /// `<s>`, Llama 3's `<|begin_of_text|>`; none for GPT-2's): what the `tokenizers`
  /// package's encode(text, add_special_tokens=True) adds at the start.
  const std::vector<uint32_t>& template_prefix_ids() const;
  /// The ids the post-processor puts after a single text (an EOS, when the
  /// template has one; none for Llama 2's and Llama 3's files).
  const std::vector<uint32_t>& template_suffix_ids() const;
  /// The largest id + 1, added tokens included.
  int64_t vocab_size() const;
  /// The bytes token `id` decodes to in the middle of a text (empty for an
  /// id no token has). Throws for id >= vocab_size().
  const std::string& token_bytes(uint32_t id) const;
  /// The id of a token by its name in the file (e.g. "<|endoftext|>" or the
  /// byte-level form "Ġthe"), if the vocabulary or the added tokens hold it.
  std::optional<uint32_t> token_id(const std::string& token) const;
  /// The file this tokenizer was read from.
  const std::string& path() const;
  /// What the file holds that reads but may surprise, one sentence each
  /// naming the file: ids given to more than one token (the `tokenizers`
  /// package accepts those too, but decode then gives the last token of
  /// each). Empty for a clean file; the tools print these as warnings.
  const std::vector<std::string>& warnings() const;

  /// The implementation (the library's own).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The settings of train_bpe, chainable:
/// BpeTrainerOptions().vocab_size(4096).min_frequency(2).
struct BpeTrainerOptions {
  /// The vocabulary size to reach: 256 byte tokens + special tokens + merges
  /// (fewer merges if the text runs out of pairs). 4096 by default.
  BpeTrainerOptions& vocab_size(int64_t v) { vocab_size_ = v; return *this; }
  /// A pair is merged only if it occurs at least this often (2 by default).
  BpeTrainerOptions& min_frequency(int64_t v) { min_frequency_ = v; return *this; }
  /// The added special tokens, ids 0.. in this order ({"<|endoftext|>"} by default).
  BpeTrainerOptions& special_tokens(std::vector<std::string> v) { special_tokens_ = std::move(v); return *this; }
  /// The threads that count words (0: the hardware's; 1 by default).
  BpeTrainerOptions& threads(int v) { threads_ = v; return *this; }
  /// Report progress on stderr (false by default).
  BpeTrainerOptions& verbose(bool v) { verbose_ = v; return *this; }
  /// The settings above, read back.
  ///@{
  int64_t vocab_size() const { return vocab_size_; }
  int64_t min_frequency() const { return min_frequency_; }
  const std::vector<std::string>& special_tokens() const { return special_tokens_; }
  int threads() const { return threads_; }
  bool verbose() const { return verbose_; }
  ///@}

 private:
  int64_t vocab_size_ = 4096;
  int64_t min_frequency_ = 2;
  std::vector<std::string> special_tokens_{"<|endoftext|>"};
  int threads_ = 1;
  bool verbose_ = false;
};

/// Trains a byte-level BPE on `files` (GPT-2's pre-tokenization regex, a
/// 256-byte alphabet, then merges of the most frequent pair, ties broken by
/// the smaller pair of token strings) and writes a GPT-2-style tokenizer.json
/// to `tokenizer_json_out`, which the `tokenizers` package loads and encodes
/// as Tokenizer does. Throws std::runtime_error naming an unreadable file or
/// a vocab_size below 256 + special tokens.
void train_bpe(const std::vector<std::string>& files, const std::string& tokenizer_json_out,
               const BpeTrainerOptions& options);

}  // namespace fsdp::text
