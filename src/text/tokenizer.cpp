// fsdp::text::Tokenizer's encoding and decoding over the tables
// tokenizer_json.cpp reads (byte-level or SentencePiece-style BPE): encoding is
// added-token split, normalizer, pre-tokenizer, then a rank-ordered BPE merge
// per piece (cached per piece). The `tokenizers` package (Rust) is the spec:
// tokenizers/src/{models/bpe/model.rs, pre_tokenizers/metaspace.rs,
// normalizers/*.rs, decoders/*.rs, processors/template.rs}.
#include "fsdp/tokenizer.h"

#include <algorithm>
#include <queue>
#include <stdexcept>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace fsdp::text {

namespace {

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
  size_t cut = 0;  // Strip: up to strip_start of strip_content off the start
  const std::string& content = start.strip_content;
  for (size_t k = 0; k < start.strip_start && out.compare(cut, content.size(), content) == 0; ++k) cut += content.size();
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
