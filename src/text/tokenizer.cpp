// fsdp::text::Tokenizer: a Hugging Face tokenizer.json with a byte-level BPE
// model, read into id tables; encoding is added-token split, pre-tokenizer,
// then a rank-ordered BPE merge per piece (cached per piece).
#include "fsdp/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <queue>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace fsdp::text {

namespace {

using json = nlohmann::json;

constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();

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
  bool nfc_normalizer = false;  // normalizer NFC (Qwen's); else none
  std::vector<AddedToken> raw_added, normalized_added;  // matched before / after normalization
  PreTokenizer pre_tokenizer;
  PieceCache cache;
  std::vector<std::string> warnings;  // what reads, but may surprise (Tokenizer::warnings)
  std::set<uint32_t> shared_ids;      // ids given to two different tokens
  std::string first_shared;           // the first of them, described

  void read(const json& root);
  void read_model(const json& model);
  void read_merges(const json& merges_json);
  void read_added_tokens(const json& added);
  void read_pre_tokenizer(const json& pre);
  void check_supported(const json& root);
  void set_token(uint32_t id, const std::string& name, bool added);

  void encode_text(std::string_view text, std::vector<uint32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
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
  if (!added && byte_level_to_bytes(name, raw)) {
    bytes[id] = raw;
    by_bytes.emplace(raw, id);
  } else {
    bytes[id] = name;  // as the ByteLevel decoder does for a token outside its alphabet
  }
}

void Tokenizer::Impl::check_supported(const json& root) {
  const json normalizer = root.value("normalizer", json());
  nfc_normalizer = normalizer.is_object() && normalizer.value("type", "") == "NFC";
  if (!normalizer.is_null() && !nfc_normalizer) {
    fail(path, "unsupported normalizer " + normalizer.value("type", normalizer.dump()) +
                   " (only null, as in GPT-2's and Llama 3's tokenizers, or NFC, as in Qwen's)");
  }
  const json decoder = root.value("decoder", json());
  if (!decoder.is_null() && decoder.value("type", "") != "ByteLevel") {
    fail(path, "unsupported decoder " + decoder.value("type", decoder.dump()) + " (expected ByteLevel or null)");
  }
}

void Tokenizer::Impl::read(const json& root) {
  if (!root.is_object() || !root.contains("model")) fail(path, "not a tokenizer.json: no \"model\" object");
  check_supported(root);
  read_model(root.at("model"));
  read_added_tokens(root.value("added_tokens", json::array()));
  read_pre_tokenizer(root.value("pre_tokenizer", json()));
  if (!shared_ids.empty()) {
    const size_t n = shared_ids.size();
    warnings.push_back("tokenizer '" + path + "': " + std::to_string(n) + " id" + (n > 1 ? "s are" : " is") +
                       " given to more than one token, the first " + first_shared +
                       ": decode gives the last token of each, so text using the others does not decode back");
  }
}

void Tokenizer::Impl::read_model(const json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") fail(path, "unsupported model type '" + type + "' (only byte-level BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(key, json());
    if (!v.is_null() && v != "") fail(path, std::string("unsupported BPE option ") + key + " = " + v.dump());
  }
  if (model.value("byte_fallback", false)) fail(path, "unsupported BPE option byte_fallback = true");
  const json dropout = model.value("dropout", json());
  if (!dropout.is_null() && dropout.get<double>() != 0.0) fail(path, "unsupported BPE dropout " + dropout.dump());
  ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model.at("vocab").is_object()) fail(path, "the BPE model has no vocab object");
  for (const auto& [name, id] : model.at("vocab").items()) {
    set_token(entry_id(path, "vocab entry '" + name + "'", id), name, false);
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

void Tokenizer::Impl::read_added_tokens(const json& added) {
  for (const json& t : added) {
    const std::string content = t.at("content").get<std::string>();
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (t.value(flag, false)) fail(path, "added token '" + content + "' has " + flag + " = true (unsupported)");
    }
    if (content.empty()) fail(path, "an added token has empty content");
    const uint32_t id = entry_id(path, "added token '" + content + "'", t.at("id"));
    set_token(id, content, true);
    (t.value("normalized", !t.value("special", false)) ? normalized_added : raw_added).push_back({content, id});
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
  } else {
    fail(path, "unsupported pre-tokenizer '" + type + "' (ByteLevel, Split or a Sequence of them)");
  }
}

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
    if (i > start) emit(text.substr(start, i - start), kNoId);
    emit(std::string_view(), match->id);
    start = i + match->content.size();
    i = start - 1;
  }
  if (start < text.size()) emit(text.substr(start), kNoId);
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<uint32_t>& out) const {
  const auto pieces = [&](std::string_view piece) { encode_piece(piece, out); };
  const auto normalized_part = [&](std::string_view part, uint32_t id) {
    if (id != kNoId) out.push_back(id);
    else pre_tokenizer.for_each_piece(part, pieces);
  };
  split_added(text, raw_added, [&](std::string_view part, uint32_t id) {
    if (id != kNoId) {
      out.push_back(id);
    } else {
      std::string scratch;
      split_added(nfc_normalizer ? nfc(part, scratch) : part, normalized_added, normalized_part);
    }
  });
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
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
  impl_->encode_text(valid_utf8(text, scratch), ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string out;
  for (const uint32_t id : ids) out += token_bytes(id);
  return out;
}

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
