// fsdp::text::Tokenizer: a Hugging Face tokenizer.json with a BPE model,
// byte-level or SentencePiece-style, read into id tables; encoding is
// added-token split, normalizer, pre-tokenizer, then a rank-ordered BPE merge
// per piece (cached per piece). The `tokenizers` package (Rust) is the spec:
// tokenizers/src/{models/bpe/model.rs, pre_tokenizers/metaspace.rs,
// normalizers/*.rs, decoders/*.rs, processors/template.rs}.
#include "fsdp/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace fsdp::text {

namespace {

using json = nlohmann::json;

constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();

// SentencePiece's stand-in for a space, U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// Where a piece of text stands: at the start of the text, its own piece
// after an added token (or a split), or continuing text encoded before.
using PieceStart = PreTokenizer::Start;

// One step of the normalizer: NFC, Prepend(text), Replace(text, content).
struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string text, content;
};

// What a SentencePiece-style decoder does besides each token's own text:
// Metaspace drops the replacement from the first token; Strip after Fuse
// removes up to `strip_start` leading `strip_content` from the text.
struct TextStart {
  std::string metaspace_dropped;  // Metaspace decoder's replacement (prepend_scheme not never); empty: none
  size_t strip_start = 0;
  std::string strip_content;
};

// The byte a token named <0xNN> stands for (ByteFallback reads hex of
// either case), or -1.
int byte_token_value(std::string_view name) {
  if (name.size() != 6 || name.substr(0, 3) != "<0x" || name[5] != '>') return -1;
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = hex(name[3]), low = hex(name[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

// The code point of the valid UTF-8 sequence of `length` bytes at text[i].
uint32_t code_point_at(std::string_view text, size_t i, size_t length) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(text[i + k])); };
  if (length == 1) return byte(0);
  uint32_t cp = byte(0) & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) cp = (cp << 6) | (byte(k) & 0x3F);
  return cp;
}

// The length of the (valid) UTF-8 character at text[i].
size_t character_length(std::string_view text, size_t i) {
  size_t invalid_run = 0;
  const size_t length = utf8_sequence_length(text, i, invalid_run);
  return length ? length : 1;
}

void replace_all(std::string& text, const std::string& pattern, const std::string& content) {
  if (pattern.empty() || text.find(pattern) == std::string::npos) return;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t from = 0;
  for (size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, from)) {
    out.append(text, from, at - from);
    out += content;
    from = at + pattern.size();
  }
  out.append(text, from, std::string::npos);
  text.swap(out);
}

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

// A merge of a pair: its rank (lower merges first) and the merged token.
struct Merge {
  uint32_t rank;
  uint32_t id;
};

// An added token, matched literally in the text before pre-tokenization.
struct AddedToken {
  std::string content;
  uint32_t id;
  bool lstrip = false, rstrip = false;  // the match takes the whitespace before / after it
  bool single_word = false;             // matched only with no word character on either side
};

// The code point before text[at] (at > 0, valid UTF-8) and where it starts.
uint32_t code_point_before(std::string_view text, size_t at, size_t& begin) {
  begin = at - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return code_point_at(text, begin, at - begin);
}

// Regex's \s and \w as the `tokenizers` package's regex crate reads them
// (Unicode's White_Space; Alphabetic, marks, decimal digits, connector
// punctuation, Join_Control), from ICU's tables.
bool is_whitespace(uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }
bool is_word_character(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

// Where the whitespace that ends text[..at] begins (at itself if none).
size_t whitespace_before(std::string_view text, size_t at) {
  size_t begin = at;
  while (at > 0 && is_whitespace(code_point_before(text, at, begin))) at = begin;
  return at;
}

// Where the whitespace that starts text[at..] ends.
size_t whitespace_after(std::string_view text, size_t at) {
  while (at < text.size()) {
    const size_t length = character_length(text, at);
    if (!is_whitespace(code_point_at(text, at, length))) break;
    at += length;
  }
  return at;
}

// A match of a single_word token at [begin, end) with a word character next to it.
bool inside_word(std::string_view text, size_t begin, size_t end) {
  size_t unused = 0;
  return (begin > 0 && is_word_character(code_point_before(text, begin, unused))) ||
         (end < text.size() && is_word_character(code_point_at(text, end, character_length(text, end))));
}

// Pieces already encoded, shared by the threads that encode: sharded, each
// shard read-mostly; it stops growing when full, as the `tokenizers` cache does.
class PieceCache {
 public:
  bool find(std::string_view piece, std::vector<uint32_t>& out) const {
    const Shard& shard = shards_[std::hash<std::string_view>{}(piece) % kShards];
    std::shared_lock lock(shard.mutex);
    const auto found = shard.ids.find(piece);
    if (found == shard.ids.end()) return false;
    out.insert(out.end(), found->second.begin(), found->second.end());
    return true;
  }
  void insert(std::string_view piece, const uint32_t* ids, size_t count) const {
    if (piece.size() > kMaxPieceBytes) return;
    Shard& shard = shards_[std::hash<std::string_view>{}(piece) % kShards];
    std::unique_lock lock(shard.mutex);
    if (shard.ids.size() >= kEntriesPerShard || shard.ids.count(piece)) return;
    shard.keys.emplace_back(piece);
    shard.ids.emplace(shard.keys.back(), std::vector<uint32_t>(ids, ids + count));
  }

 private:
  static constexpr size_t kShards = 64, kEntriesPerShard = 2048, kMaxPieceBytes = 256;
  struct Shard {
    mutable std::shared_mutex mutex;
    std::deque<std::string> keys;  // stable storage for the map's views
    std::unordered_map<std::string_view, std::vector<uint32_t>> ids;
  };
  mutable std::array<Shard, kShards> shards_;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("tokenizer '" + path + "': " + what);
}

std::string json_text(const json& j) { return j.is_null() ? "null" : j.dump(); }

// The pattern of a Split pre-tokenizer: {"Regex": ...}, or {"String": ...} quoted.
std::string split_pattern(const std::string& path, const json& split) {
  const json& pattern = split.at("pattern");
  if (pattern.contains("Regex")) return pattern.at("Regex").get<std::string>();
  if (pattern.contains("String")) {
    std::string quoted;
    for (const char c : pattern.at("String").get<std::string>()) {
      if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) quoted += '\\';
      quoted += c;
    }
    return quoted;
  }
  fail(path, "a Split pre-tokenizer's pattern must be Regex or String, found " + pattern.dump());
}

// `text` in Unicode normalization form C (ICU's, as the NFC normalizer of
// the `tokenizers` package). Text with no code point from U+0300 on is its
// own NFC (every character below has NFC_Quick_Check Yes and none composes
// with what precedes it), so most text is returned as it is.
std::string_view nfc(std::string_view text, std::string& scratch) {
  const bool inert = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  if (inert) return text;
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
  std::u16string utf16(text.size(), u'\0');
  int32_t length = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(utf16.data()), static_cast<int32_t>(utf16.size()), &length, text.data(),
                static_cast<int32_t>(text.size()), &status);
  utf16.resize(static_cast<size_t>(length));
  std::u16string normalized(utf16.size() * 3 + 16, u'\0');
  const int32_t n = unorm2_normalize(normalizer, reinterpret_cast<const UChar*>(utf16.data()), length,
                                     reinterpret_cast<UChar*>(normalized.data()), static_cast<int32_t>(normalized.size()),
                                     &status);
  scratch.assign(static_cast<size_t>(n) * 3 + 16, '\0');
  int32_t bytes = 0;
  u_strToUTF8(scratch.data(), static_cast<int32_t>(scratch.size()), &bytes, reinterpret_cast<const UChar*>(normalized.data()),
              n, &status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("NFC normalization failed: ") + u_errorName(status));
  scratch.resize(static_cast<size_t>(bytes));
  return scratch;
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::vector<std::string> names;                      // by id: the token as the file spells it
  std::vector<std::string> bytes;                      // by id: what it decodes to
  std::unordered_map<std::string, uint32_t> by_name;   // vocabulary and added tokens
  std::unordered_map<std::string, uint32_t> by_bytes;  // byte-level tokens by their bytes (ignore_merges)
  std::array<uint32_t, 256> byte_id{};                 // the token of each single byte, or kNoId
  std::unordered_map<uint64_t, Merge> merges;
  bool ignore_merges = false;
  std::vector<NormalizerStep> normalizer;
  std::vector<AddedToken> raw_added, normalized_added;  // matched before / after normalization
  std::vector<std::pair<std::string, bool>> added_texts;  // each added token as the text spells it, and its rstrip
  PreTokenizer pre_tokenizer;
  std::vector<uint32_t> prefix_ids, suffix_ids;  // the post-processor's, around a single text
  PieceCache cache;
  std::vector<std::string> warnings;  // what reads, but may surprise (Tokenizer::warnings)
  std::set<uint32_t> shared_ids;      // ids given to two different tokens
  std::string first_shared;           // the first of them, described

  // SentencePiece-style files (a decoder other than ByteLevel): BPE over characters.
  bool byte_level = true;
  std::vector<std::pair<std::string, std::string>> decoder_replaces;  // Replace steps, in order
  bool decoder_byte_fallback = false;                                  // ByteFallback step
  TextStart text_start;
  bool byte_fallback = false, fuse_unk = false;
  uint32_t unk_id = kNoId;
  std::array<uint32_t, 256> fallback_id{};              // the <0xNN> token of each byte, or kNoId
  std::unordered_map<std::string, uint32_t> vocab;      // the model's own (added tokens are not looked up)
  std::unordered_map<uint32_t, uint32_t> character_id;  // single-character tokens by code point
  std::unordered_set<uint32_t> joined_to_metaspace;     // code points some token holds right before "▁"
  std::array<uint32_t, 128> ascii_id{};                 // character_id's ASCII part, or kNoId
  bool spaces_become_metaspace = false;  // a Metaspace("▁") pre-tokenizer or a Replace(" ", "▁") normalizer
  bool replaces_characters_only = true;  // every normalizer Replace pattern is one character

  void read(const json& root);
  void read_model(const json& model);
  void read_merges(const json& merges_json);
  void read_added_tokens(const json& added);
  void read_pre_tokenizer(const json& pre);
  void read_normalizer(const json& normalizer_json);
  void read_decoder(const json& decoder);
  void read_decoder_step(const json& step, bool& fused);
  void read_post_processor(const json& processor);
  void read_template(const json& processor);
  void index_characters();
  void set_token(uint32_t id, const std::string& name, bool added);
  std::string decoded_name(const std::string& name) const;

  void encode_text(std::string_view text, bool continued, std::vector<uint32_t>& out) const;
  std::string_view normalize(std::string_view part, bool continued, std::string& scratch) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
  void encode_characters(std::string_view piece, std::vector<uint32_t>& out) const;
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;
  bool safe_before_metaspace(std::string_view text, size_t at) const;
  bool restarts_before_space_after(char c) const;
  bool added_token_at_cut(std::string_view text, size_t cut) const;
  void merge_word(std::vector<uint32_t>& symbols) const;
  void split_added(std::string_view text, const std::vector<AddedToken>& tokens,
                   const std::function<void(std::string_view, uint32_t)>& emit) const;
};

// The id of a vocab or added-token entry: a whole number in [0, kMaxTokenIds).
// The tables are indexed by id, so an id is what they allocate: checked
// before, with the file and the entry named (an id of 2^31 once asked for
// 64 GiB and ended in std::bad_alloc).
namespace {
uint32_t entry_id(const std::string& path, const std::string& entry, const json& id) {
  if (!id.is_number_unsigned()) fail(path, entry + " has id " + id.dump() + ", expected a whole number >= 0");
  const uint64_t value = id.get<uint64_t>();
  if (value >= kMaxTokenIds) {
    fail(path, entry + " has id " + std::to_string(value) + ", expected an id below " + std::to_string(kMaxTokenIds));
  }
  return static_cast<uint32_t>(value);
}
}  // namespace

void Tokenizer::Impl::set_token(uint32_t id, const std::string& name, bool added) {
  if (id < names.size() && !names[id].empty() && names[id] != name) {
    // As the `tokenizers` package, read, not refused; but decode gives the
    // last token of the id, so the text no longer comes back.
    if (shared_ids.empty()) first_shared = "id " + std::to_string(id) + " ('" + names[id] + "' and '" + name + "')";
    shared_ids.insert(id);
  }
  if (id >= names.size()) {
    names.resize(id + 1);
    bytes.resize(id + 1);
  }
  names[id] = name;
  by_name[name] = id;
  std::string raw;
  if (!byte_level) {
    bytes[id] = decoded_name(name);
  } else if (!added && byte_level_to_bytes(name, raw)) {
    bytes[id] = raw;
    by_bytes.emplace(raw, id);
  } else {
    bytes[id] = name;  // as the ByteLevel decoder does for a token outside its alphabet
  }
}

// A Sequence of NFC, Prepend and Replace (of a string): Qwen's NFC, and the
// Sequence[Prepend("▁"), Replace(" ", "▁")] transformers' LlamaConverter
// writes for Llama 2, Mistral, TinyLlama and Phi-3.
void Tokenizer::Impl::read_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const json& step : n.at("normalizers")) read_normalizer(step);
  } else if (type == "NFC") {
    normalizer.push_back({NormalizerStep::kNfc, "", ""});
  } else if (type == "Prepend") {
    normalizer.push_back({NormalizerStep::kPrepend, n.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace" && n.at("pattern").contains("String")) {
    normalizer.push_back({NormalizerStep::kReplace, n.at("pattern").at("String").get<std::string>(),
                          n.at("content").get<std::string>()});
  } else {
    const std::string what = type == "Replace" ? "Replace of pattern " + n.at("pattern").dump() : n.value("type", n.dump());
    fail(path, "unsupported normalizer " + what +
                   " (expected null, NFC as in Qwen's tokenizers, Prepend, Replace of a String pattern, "
                   "or a Sequence of them as in Llama 2's)");
  }
}

// ByteLevel (or none) makes a byte-level file; a Sequence of Replace,
// ByteFallback, Fuse and Strip (Llama 2's), or Metaspace, a SentencePiece-style one.
void Tokenizer::Impl::read_decoder(const json& decoder) {
  const std::string type = decoder.is_null() ? "ByteLevel" : decoder.value("type", "");
  if (type == "ByteLevel") return;
  byte_level = false;
  if (type == "Metaspace") {
    const std::string replacement = decoder.value("replacement", std::string(kMetaspace));
    decoder_replaces.emplace_back(replacement, " ");
    if (decoder.value("prepend_scheme", "always") != "never" && decoder.value("add_prefix_space", true)) {
      text_start.metaspace_dropped = replacement;
    }
    return;
  }
  bool fused = false;
  if (type == "Sequence") {
    for (const json& step : decoder.at("decoders")) read_decoder_step(step, fused);
  } else {
    read_decoder_step(decoder, fused);
  }
}

void Tokenizer::Impl::read_decoder_step(const json& step, bool& fused) {
  const std::string type = step.value("type", "");
  if (type == "Replace" && step.at("pattern").contains("String") && !decoder_byte_fallback && !fused) {
    decoder_replaces.emplace_back(step.at("pattern").at("String").get<std::string>(), step.at("content").get<std::string>());
  } else if (type == "ByteFallback" && !fused) {
    decoder_byte_fallback = true;
  } else if (type == "Fuse") {
    fused = true;
  } else if (type == "Strip" && fused && step.value("stop", 0) == 0 && text_start.strip_start == 0) {
    text_start.strip_start = step.value("start", 0);
    text_start.strip_content = step.at("content").get<std::string>();
  } else {
    fail(path, "unsupported decoder step " + step.dump() +
                   " (expected ByteLevel, Metaspace, or a Sequence of Replace of a String, ByteFallback, Fuse, "
                   "then Strip with stop 0, as in Llama 2's tokenizer)");
  }
}

void Tokenizer::Impl::read(const json& root) {
  if (!root.is_object() || !root.contains("model")) fail(path, "not a tokenizer.json: no \"model\" object");
  read_normalizer(root.value("normalizer", json()));
  read_decoder(root.value("decoder", json()));
  read_model(root.at("model"));
  read_added_tokens(root.value("added_tokens", json::array()));
  read_pre_tokenizer(root.value("pre_tokenizer", json()));
  if (!byte_level && pre_tokenizer.has_byte_level()) {
    fail(path, "a ByteLevel pre-tokenizer with a SentencePiece-style decoder (expected the ByteLevel decoder)");
  }
  if (byte_level && pre_tokenizer.prepends_metaspace()) {
    fail(path, "a Metaspace pre-tokenizer with a ByteLevel decoder (expected a Metaspace or Sequence decoder)");
  }
  if (!byte_level) index_characters();
  read_post_processor(root.value("post_processor", json()));
  if (!shared_ids.empty()) {
    const size_t n = shared_ids.size();
    warnings.push_back("tokenizer '" + path + "': " + std::to_string(n) + " id" + (n > 1 ? "s are" : " is") +
                       " given to more than one token, the first " + first_shared +
                       ": decode gives the last token of each, so text using the others does not decode back");
  }
}

void Tokenizer::Impl::read_model(const json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") fail(path, "unsupported model type '" + type + "' (only BPE, byte-level or SentencePiece-style)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(key, json());
    if (!v.is_null() && v != "") fail(path, std::string("unsupported BPE option ") + key + " = " + v.dump());
  }
  byte_fallback = model.value("byte_fallback", false);
  if (byte_fallback && byte_level) {
    fail(path, "unsupported BPE option byte_fallback = true with a ByteLevel decoder (byte_fallback goes with "
               "SentencePiece-style files: a decoder Sequence with ByteFallback, as in Llama 2's)");
  }
  fuse_unk = model.value("fuse_unk", false);
  const json dropout = model.value("dropout", json());
  if (!dropout.is_null() && dropout.get<double>() != 0.0) fail(path, "unsupported BPE dropout " + dropout.dump());
  ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model.at("vocab").is_object()) fail(path, "the BPE model has no vocab object");
  for (const auto& [name, id] : model.at("vocab").items()) {
    set_token(entry_id(path, "vocab entry '" + name + "'", id), name, false);
  }
  if (!byte_level) {
    vocab = by_name;  // only the model's tokens so far: BPE looks up no added token
    const json unk = model.value("unk_token", json());
    if (!unk.is_null()) {
      const auto found = vocab.find(unk.get<std::string>());
      if (found == vocab.end()) fail(path, "the BPE unk_token " + unk.dump() + " is not in the vocab");
      unk_id = found->second;
    }
  }
  byte_id.fill(kNoId);
  for (uint32_t b = 0; b < 256; ++b) {
    const auto found = by_bytes.find(std::string(1, static_cast<char>(b)));
    if (found != by_bytes.end()) byte_id[b] = found->second;
  }
  read_merges(model.value("merges", json::array()));
}

void Tokenizer::Impl::read_merges(const json& merges_json) {
  merges.reserve(merges_json.size() * 2);
  uint32_t rank = 0;
  for (const json& m : merges_json) {
    std::string a, b;
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) fail(path, "merge \"" + s + "\" is not two tokens separated by a space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {  // ["a", "b"]
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail(path, "merge " + m.dump() + " is neither \"a b\" nor [a, b]");
    }
    const auto ia = by_name.find(a), ib = by_name.find(b), merged = by_name.find(a + b);
    if (ia == by_name.end() || ib == by_name.end() || merged == by_name.end()) {
      fail(path, "merge " + m.dump() + " names a token the vocab does not hold");
    }
    merges.emplace(pair_key(ia->second, ib->second), Merge{rank++, merged->second});
  }
}

// The text a token decodes to in a SentencePiece-style file: its <0xNN>
// byte under ByteFallback, else its name through the Replace steps.
std::string Tokenizer::Impl::decoded_name(const std::string& name) const {
  const int byte = decoder_byte_fallback ? byte_token_value(name) : -1;
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  std::string text = name;
  for (const auto& [pattern, content] : decoder_replaces) replace_all(text, pattern, content);
  return text;
}

// The tables BPE over characters reads: single-character tokens, the
// <0xNN> tokens, and the characters some token joins to a following "▁"
// (a word may be cut before a "▁" after any other: no token spans the cut).
void Tokenizer::Impl::index_characters() {
  ascii_id.fill(kNoId);
  fallback_id.fill(kNoId);
  for (const auto& [name, id] : vocab) {
    if (!name.empty() && character_length(name, 0) == name.size()) {
      const uint32_t cp = code_point_at(name, 0, name.size());
      character_id[cp] = id;
      if (cp < 128) ascii_id[cp] = id;
    }
    for (size_t at = name.find(kMetaspace, 1); at != std::string::npos; at = name.find(kMetaspace, at + 1)) {
      size_t begin = at - 1;
      while (begin > 0 && (static_cast<unsigned char>(name[begin]) & 0xC0) == 0x80) --begin;
      joined_to_metaspace.insert(code_point_at(name, begin, at - begin));
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);  // the `tokenizers` package's format!("<{b:#04X}>")
    const auto found = vocab.find(name);
    if (found != vocab.end()) fallback_id[b] = found->second;
  }
  for (const NormalizerStep& step : normalizer) {
    if (step.kind != NormalizerStep::kReplace) continue;
    if (step.text == " " && step.content == kMetaspace) spaces_become_metaspace = true;
    if (step.text.empty() || character_length(step.text, 0) != step.text.size()) replaces_characters_only = false;
  }
  if (pre_tokenizer.replaces_spaces_with(kMetaspace)) spaces_become_metaspace = true;
}

// The post-processor's ids around a single text; ByteLevel adds none.
void Tokenizer::Impl::read_post_processor(const json& processor) {
  if (processor.is_null()) return;
  const std::string type = processor.value("type", "");
  if (type == "Sequence") {
    for (const json& step : processor.at("processors")) read_post_processor(step);
  } else if (type == "TemplateProcessing") {
    read_template(processor);
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {  // [cls] text [sep]
    prefix_ids.push_back(entry_id(path, type + " cls", processor.at("cls").at(1)));
    suffix_ids.push_back(entry_id(path, type + " sep", processor.at("sep").at(1)));
  } else if (type != "ByteLevel") {
    fail(path, "unsupported post-processor " + processor.value("type", processor.dump()) +
                   " (expected TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing or a Sequence of them)");
  }
  for (const auto* added : {&prefix_ids, &suffix_ids}) {
    for (const uint32_t id : *added) {
      if (id >= names.size() || names[id].empty()) {
        fail(path, "the post-processor adds id " + std::to_string(id) + ", expected the id of a token");
      }
    }
  }
}

// TemplateProcessing's single template: special tokens, one $A, special tokens.
void Tokenizer::Impl::read_template(const json& processor) {
  bool after_text = false;
  const json& special_tokens = processor.at("special_tokens");
  for (const json& piece : processor.at("single")) {
    if (piece.contains("Sequence")) {
      if (piece.at("Sequence").at("id") != "A" || after_text) {
        fail(path, "a TemplateProcessing single template holding " + piece.dump() + ", expected one sequence $A");
      }
      after_text = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      if (!special_tokens.contains(name)) fail(path, "the TemplateProcessing template names '" + name + "', which its special_tokens lack");
      for (const json& id : special_tokens.at(name).at("ids")) {
        (after_text ? suffix_ids : prefix_ids).push_back(entry_id(path, "the template's special token '" + name + "'", id));
      }
    } else {
      fail(path, "a TemplateProcessing template piece " + piece.dump() + ", expected Sequence or SpecialToken");
    }
  }
  if (!after_text) fail(path, "a TemplateProcessing single template without the sequence $A");
}

void Tokenizer::Impl::read_added_tokens(const json& added) {
  for (const json& t : added) {
    const std::string content = t.at("content").get<std::string>();
    if (content.empty()) fail(path, "an added token has empty content");
    const uint32_t id = entry_id(path, "added token '" + content + "'", t.at("id"));
    set_token(id, content, true);
    AddedToken token{content, id, t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)};
    added_texts.emplace_back(content, token.rstrip);
    if (t.value("normalized", !t.value("special", false))) {
      // Matched in the normalized text, so matched as the normalizer spells it (Prepend's "▁" included).
      std::string scratch;
      token.content = std::string(normalize(content, /*continued=*/false, scratch));
      if (!token.content.empty()) normalized_added.push_back(std::move(token));
    } else {
      raw_added.push_back(std::move(token));
    }
  }
  // Leftmost-longest matching tries the longer tokens first.
  for (auto* list : {&raw_added, &normalized_added}) {
    std::stable_sort(list->begin(), list->end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  }
}

void Tokenizer::Impl::read_pre_tokenizer(const json& pre) {
  if (pre.is_null()) return;
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pre.at("pretokenizers")) read_pre_tokenizer(p);
  } else if (type == "ByteLevel") {
    pre_tokenizer.add_byte_level(pre.value("add_prefix_space", false), pre.value("use_regex", true));
  } else if (type == "Split") {
    const std::string behavior = pre.value("behavior", "");
    if (behavior != "Isolated" || pre.value("invert", false)) {
      fail(path, "unsupported Split pre-tokenizer (behavior " + behavior + ", invert " +
                     json_text(pre.value("invert", json())) + "): only Isolated, not inverted");
    }
    try {
      pre_tokenizer.add_split(split_pattern(path, pre));
    } catch (const std::runtime_error& e) {  // Oniguruma's refusal of the pattern (found by tokenizer_fuzz)
      if (std::string(e.what()).rfind("tokenizer '", 0) == 0) throw;
      fail(path, std::string("a Split pre-tokenizer's pattern: ") + e.what());
    }
  } else if (type == "Metaspace") {
    const std::string scheme = pre.value("prepend_scheme", pre.value("add_prefix_space", true) ? "always" : "never");
    const std::map<std::string, MetaspacePrepend> schemes = {
        {"always", MetaspacePrepend::kAlways}, {"first", MetaspacePrepend::kFirst}, {"never", MetaspacePrepend::kNever}};
    if (!schemes.count(scheme)) fail(path, "a Metaspace prepend_scheme of \"" + scheme + "\", expected always, first or never");
    const std::string replacement = pre.value("replacement", std::string(kMetaspace));
    if (replacement.empty()) fail(path, "a Metaspace pre-tokenizer with an empty replacement");
    pre_tokenizer.add_metaspace(replacement, schemes.at(scheme), pre.value("split", true));
  } else {
    fail(path, "unsupported pre-tokenizer '" + type + "' (ByteLevel, Split, Metaspace or a Sequence of them)");
  }
}

// The leftmost-longest matches of `tokens`, not overlapping, as the
// `tokenizers` package's AddedVocabulary::find_matches: a single_word match
// inside a word is passed over; lstrip and rstrip widen a match over the
// whitespace beside it (not into the previous match).
void Tokenizer::Impl::split_added(std::string_view text, const std::vector<AddedToken>& tokens,
                                  const std::function<void(std::string_view, uint32_t)>& emit) const {
  size_t start = 0;
  for (size_t i = 0; i < text.size() && !tokens.empty(); ++i) {
    const AddedToken* match = nullptr;
    for (const AddedToken& t : tokens) {
      if (t.content[0] == text[i] && text.compare(i, t.content.size(), t.content) == 0) {
        match = &t;
        break;
      }
    }
    if (!match) continue;
    size_t begin = i, end = i + match->content.size();
    i = end - 1;  // the next match starts after this one, taken or not
    if (match->single_word && inside_word(text, begin, end)) continue;
    if (match->lstrip) begin = std::max(start, whitespace_before(text, begin));
    if (match->rstrip) end = whitespace_after(text, end);
    if (begin > start) emit(text.substr(start, begin - start), kNoId);
    emit(std::string_view(), match->id);
    start = end;
    i = end - 1;
  }
  if (start < text.size()) emit(text.substr(start), kNoId);
}

// As the `tokenizers` package: raw added tokens split off, the rest
// normalized, normalized added tokens split off, the rest pre-tokenized.
// `continued`: the text continues one encoded before (encode_continuation).
void Tokenizer::Impl::encode_text(std::string_view text, bool continued, std::vector<uint32_t>& out) const {
  const auto pieces = [&](std::string_view piece) { encode_piece(piece, out); };
  split_added(text, raw_added, [&](std::string_view part, uint32_t id) {
    if (id != kNoId) {
      out.push_back(id);
      return;
    }
    const bool first = part.data() == text.data();
    std::string scratch;
    const std::string_view normalized = normalize(part, continued && first, scratch);
    split_added(normalized, normalized_added, [&](std::string_view sub, uint32_t sub_id) {
      if (sub_id != kNoId) {
        out.push_back(sub_id);
        return;
      }
      PieceStart start = PieceStart::kPiece;
      if (first && sub.data() == normalized.data()) start = continued ? PieceStart::kContinued : PieceStart::kText;
      pre_tokenizer.for_each_piece(sub, start, pieces);
    });
  });
}

// `part` through the normalizer's steps; `continued`: it continues text
// encoded before, so Prepend adds nothing.
std::string_view Tokenizer::Impl::normalize(std::string_view part, bool continued, std::string& scratch) const {
  if (normalizer.empty()) return part;
  if (normalizer.size() == 1 && normalizer[0].kind == NormalizerStep::kNfc) return nfc(part, scratch);
  std::string text(part), composed;
  for (const NormalizerStep& step : normalizer) {
    if (step.kind == NormalizerStep::kNfc) {
      const std::string_view n = nfc(text, composed);
      if (n.data() != text.data()) text.assign(n);
    } else if (step.kind == NormalizerStep::kPrepend) {
      if (!text.empty() && !continued) text.insert(0, step.text);  // as Prepend: not to empty text
    } else {
      replace_all(text, step.text, step.content);
    }
  }
  scratch.swap(text);
  return scratch;
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (!byte_level) {
    encode_characters(piece, out);
    return;
  }
  if (piece.empty() || cache.find(piece, out)) return;
  if (ignore_merges) {
    const auto whole = by_bytes.find(std::string(piece));
    if (whole != by_bytes.end()) {
      out.push_back(whole->second);
      cache.insert(piece, &whole->second, 1);
      return;
    }
  }
  thread_local std::vector<uint32_t> symbols;
  symbols.clear();
  for (const char c : piece) {
    const uint32_t id = byte_id[static_cast<unsigned char>(c)];
    if (id != kNoId) symbols.push_back(id);  // a byte without a token is dropped, as with no unk_token
  }
  merge_word(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  cache.insert(piece, symbols.data(), symbols.size());
}

// Whether a word may be cut before the "▁" at text[at]: the character
// before it has a token of its own and no token joins it to a "▁".
bool Tokenizer::Impl::safe_before_metaspace(std::string_view text, size_t at) const {
  size_t begin = at - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  const uint32_t cp = code_point_at(text, begin, at - begin);
  return character_id.count(cp) && !joined_to_metaspace.count(cp);
}

// A SentencePiece-style piece: without a Metaspace split (Llama 2's files)
// the whole text is one BPE word; cut where no token can span (before a
// "▁"), which gives the same merges and lets the cache hold words.
void Tokenizer::Impl::encode_characters(std::string_view piece, std::vector<uint32_t>& out) const {
  size_t begin = 0;
  for (size_t at = piece.find(kMetaspace, 1); at != std::string_view::npos;
       at = piece.find(kMetaspace, at + kMetaspace.size())) {
    if (!safe_before_metaspace(piece, at)) continue;
    encode_word(piece.substr(begin, at - begin), out);
    begin = at;
  }
  encode_word(piece.substr(begin), out);
}

// BPE over the characters of `word`, as the `tokenizers` package's
// BPE::merge_word: a character outside the vocabulary becomes its <0xNN>
// tokens (byte_fallback), else the unk token (runs fused if fuse_unk), else
// nothing. An unk waits for the next known character, as there.
void Tokenizer::Impl::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.empty() || cache.find(word, out)) return;
  if (ignore_merges) {
    const auto whole = vocab.find(std::string(word));
    if (whole != vocab.end()) {
      out.push_back(whole->second);
      cache.insert(word, &whole->second, 1);
      return;
    }
  }
  thread_local std::vector<uint32_t> symbols;
  symbols.clear();
  uint32_t pending_unk = kNoId;
  for (size_t i = 0; i < word.size();) {
    const size_t length = character_length(word, i);
    const auto c = static_cast<unsigned char>(word[i]);
    uint32_t id = c < 128 ? ascii_id[c] : kNoId;
    if (c >= 128) {
      const auto found = character_id.find(code_point_at(word, i, length));
      if (found != character_id.end()) id = found->second;
    }
    const auto has_fallback = [&](char b) { return fallback_id[static_cast<unsigned char>(b)] != kNoId; };
    if (id != kNoId) {
      if (pending_unk != kNoId) symbols.push_back(pending_unk);
      pending_unk = kNoId;
      symbols.push_back(id);
    } else if (byte_fallback && std::all_of(word.begin() + i, word.begin() + i + length, has_fallback)) {
      for (size_t k = i; k < i + length; ++k) symbols.push_back(fallback_id[static_cast<unsigned char>(word[k])]);
    } else if (unk_id != kNoId) {
      if (pending_unk != kNoId && !fuse_unk) symbols.push_back(pending_unk);
      pending_unk = unk_id;
    }
    i += length;
  }
  if (pending_unk != kNoId) symbols.push_back(pending_unk);
  merge_word(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  cache.insert(word, symbols.data(), symbols.size());
}

// Whether encoding may restart before " word" after `c` (restart_point):
// always for byte-level files (their pre-tokenizers start a piece there);
// for SentencePiece-style ones when the space becomes a "▁" that no token
// joins to `c`, and no normalizer Replace could match across the cut.
bool Tokenizer::Impl::restarts_before_space_after(char c) const {
  if (byte_level) return true;
  const uint32_t id = ascii_id[static_cast<unsigned char>(c) & 0x7F];
  return spaces_become_metaspace && replaces_characters_only && id != kNoId &&
         !joined_to_metaspace.count(static_cast<unsigned char>(c));
}

// Whether a cut before text[cut] would split an added token, or follow one
// that takes the whitespace after it (rstrip): restart_point avoids both.
bool Tokenizer::Impl::added_token_at_cut(std::string_view text, size_t cut) const {
  for (const auto& [content, rstrip] : added_texts) {
    if (rstrip && cut >= content.size() && text.compare(cut - content.size(), content.size(), content) == 0) return true;
    const size_t from = cut >= content.size() ? cut - content.size() + 1 : 0;
    const size_t at = text.substr(0, cut + content.size() - 1).find(content, from);
    if (at != std::string_view::npos && at < cut) return true;
  }
  return false;
}

// Merges the pair of lowest rank, the leftmost of equals, until none is left:
// what the `tokenizers` package's priority queue does.
void Tokenizer::Impl::merge_word(std::vector<uint32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  if (n <= 48) {  // short words: a scan per merge beats a heap
    size_t size = n;
    while (size > 1) {
      uint32_t best_rank = kNoId, best_id = 0;
      size_t best = 0;
      for (size_t i = 0; i + 1 < size; ++i) {
        const auto m = merges.find(pair_key(symbols[i], symbols[i + 1]));
        if (m != merges.end() && m->second.rank < best_rank) {
          best_rank = m->second.rank;
          best_id = m->second.id;
          best = i;
        }
      }
      if (best_rank == kNoId) break;
      symbols[best] = best_id;
      std::copy(symbols.begin() + best + 2, symbols.begin() + size, symbols.begin() + best + 1);
      --size;
    }
    symbols.resize(size);
    return;
  }
  // Long words (runs of spaces or digits): a linked list and a heap of
  // (rank, position), stale entries skipped when popped.
  std::vector<int64_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  using Entry = std::tuple<uint32_t, int64_t, uint32_t, uint32_t>;  // rank, left position, left id, right id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  const auto push = [&](int64_t left) {
    if (left < 0 || next[left] < 0) return;
    const auto m = merges.find(pair_key(symbols[left], symbols[next[left]]));
    if (m != merges.end()) heap.emplace(m->second.rank, left, symbols[left], symbols[next[left]]);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
  std::vector<bool> removed(n, false);
  while (!heap.empty()) {
    const auto [rank, left, a, b] = heap.top();
    heap.pop();
    if (removed[left] || next[left] < 0 || symbols[left] != a || symbols[next[left]] != b) continue;
    const int64_t right = next[left];
    symbols[left] = merges.at(pair_key(a, b)).id;
    removed[right] = true;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    push(prev[left]);
    push(left);
  }
  size_t size = 0;
  for (int64_t i = 0; i >= 0; i = next[i]) symbols[size++] = symbols[i];
  symbols.resize(size);
}

Tokenizer::Tokenizer(const std::string& tokenizer_json_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = tokenizer_json_path;
  // A directory would read as bad JSON, a named pipe block the open.
  const auto status = std::filesystem::status(tokenizer_json_path);
  if (std::filesystem::is_directory(status)) fail(tokenizer_json_path, "is a directory, expected a tokenizer.json file");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    fail(tokenizer_json_path, "is not a regular file");
  }
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) fail(tokenizer_json_path, "cannot open the file");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    fail(tokenizer_json_path, std::string("not valid JSON: ") + e.what());
  }
  try {
    impl_->read(root);
  } catch (const json::exception& e) {
    fail(tokenizer_json_path, std::string("unexpected structure: ") + e.what());
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::string scratch;
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  impl_->encode_text(valid_utf8(text, scratch), /*continued=*/false, ids);
  return ids;
}

std::vector<uint32_t> Tokenizer::encode_continuation(std::string_view text) const {
  std::string scratch;
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  impl_->encode_text(valid_utf8(text, scratch), /*continued=*/true, ids);
  return ids;
}

size_t Tokenizer::restart_point(std::string_view text, size_t limit) const {
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto visible = [](char c) { return c > ' ' && c < 0x7F; };
  if (text.size() < 3) return 0;
  const size_t last = std::min(limit, text.size() - 2);
  // Between a visible ASCII character and " word": the space starts a piece
  // (ByteLevel's regexes; a "▁" no token joins to what precedes it).
  for (size_t p = last; p >= 1; --p) {
    if (text[p] == ' ' && visible(text[p - 1]) && letter(text[p + 1]) &&
        impl_->restarts_before_space_after(text[p - 1]) && !impl_->added_token_at_cut(text, p)) {
      return p;
    }
  }
  if (!impl_->byte_level) return 0;  // a SentencePiece-style word runs across newlines
  // After a newline with a visible ASCII character on either side: no
  // piece of the byte-level pre-tokenizers spans it, no lookahead sees past it.
  for (size_t p = last; p >= 2; --p) {
    if (text[p - 1] == '\n' && visible(text[p - 2]) && visible(text[p]) && !impl_->added_token_at_cut(text, p)) return p;
  }
  return 0;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  if (ids.empty()) return "";
  const TextStart& start = impl_->text_start;
  std::string out = token_bytes(ids[0]);  // (throws for an id outside the vocabulary)
  if (!start.metaspace_dropped.empty() && !impl_->names[ids[0]].empty()) {
    // Metaspace's decoder drops every replacement from the first token
    out = impl_->names[ids[0]];
    replace_all(out, start.metaspace_dropped, "");
    for (const auto& [pattern, content] : impl_->decoder_replaces) replace_all(out, pattern, content);
  }
  out += decode_continuation(std::vector<uint32_t>(ids.begin() + 1, ids.end()));
  size_t cut = 0;
  for (size_t k = 0; k < start.strip_start && out.compare(cut, start.strip_content.size(), start.strip_content) == 0; ++k) {
    cut += start.strip_content.size();
  }
  return out.substr(cut);
}

std::string Tokenizer::decode_continuation(const std::vector<uint32_t>& ids) const {
  std::string out;
  for (const uint32_t id : ids) out += token_bytes(id);
  return out;
}

const std::vector<uint32_t>& Tokenizer::template_prefix_ids() const { return impl_->prefix_ids; }

const std::vector<uint32_t>& Tokenizer::template_suffix_ids() const { return impl_->suffix_ids; }

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->names.size()); }

const std::string& Tokenizer::token_bytes(uint32_t id) const {
  if (id >= impl_->bytes.size()) {
    throw std::runtime_error("tokenizer '" + impl_->path + "': token id " + std::to_string(id) +
                             " is outside its vocabulary of " + std::to_string(impl_->bytes.size()));
  }
  return impl_->bytes[id];
}

std::optional<uint32_t> Tokenizer::token_id(const std::string& token) const {
  const auto found = impl_->by_name.find(token);
  if (found == impl_->by_name.end()) return std::nullopt;
  return found->second;
}

const std::string& Tokenizer::path() const { return impl_->path; }

const std::vector<std::string>& Tokenizer::warnings() const { return impl_->warnings; }

}  // namespace fsdp::text
