#pragma once
// Tokenizer::Impl, the tables a tokenizer.json is read into
// (tokenizer_json.cpp) and encoding and decoding read (tokenizer.cpp), and
// the small types they share. Internal: not installed.

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fsdp/tokenizer.h"
#include "text/pretokenizer.h"

namespace fsdp::text {

using json = nlohmann::json;

constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();

// SentencePiece's stand-in for a space, U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// Where a piece of text stands: at the start of the text, its own piece
// after an added token (or a split), or continuing text encoded before.
using PieceStart = PreTokenizer::Start;

inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

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

// `text` with every `pattern` replaced by `content` (tokenizer.cpp).
void replace_all(std::string& text, const std::string& pattern, const std::string& content);

struct Tokenizer::Impl {
  std::string path;
  std::vector<std::string> names;                      // by id: the token as the decoder reads it (an added one normalized)
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

}  // namespace fsdp::text
