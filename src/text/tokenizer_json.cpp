// Reading a Hugging Face tokenizer.json into Tokenizer::Impl's tables: the
// model (vocab, merges, byte fallback), added tokens, normalizer,
// pre-tokenizer, decoder and post-processor, each checked and refused by
// name when outside what the encoder does as the `tokenizers` package does.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace fsdp::text {

namespace {

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

}  // namespace

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
  bytes[id] = decoded_name(name);
  std::string raw;
  if (byte_level && !added && byte_level_to_bytes(name, raw)) by_bytes.emplace(raw, id);
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
    const std::string what =
        type == "Replace" ? "Replace of pattern " + n.at("pattern").dump() : n.value("type", n.dump());
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
    decoder_replaces.emplace_back(step.at("pattern").at("String").get<std::string>(),
                                  step.at("content").get<std::string>());
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

// The text a token decodes to, an added token's too (`tokenizers` decodes
// them with the rest): in a byte-level file its bytes, or its name as it is
// when a character is outside the ByteLevel decoder's alphabet; in a
// SentencePiece-style file its <0xNN> byte under ByteFallback, else its name
// through the Replace steps.
std::string Tokenizer::Impl::decoded_name(const std::string& name) const {
  std::string raw;
  if (byte_level) return byte_level_to_bytes(name, raw) ? raw : name;
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
      if (!special_tokens.contains(name)) {
        fail(path, "the TemplateProcessing template names '" + name + "', which its special_tokens lack");
      }
      for (const json& id : special_tokens.at(name).at("ids")) {
        const uint32_t value = entry_id(path, "the template's special token '" + name + "'", id);
        (after_text ? suffix_ids : prefix_ids).push_back(value);
      }
    } else {
      fail(path, "a TemplateProcessing template piece " + piece.dump() + ", expected Sequence or SpecialToken");
    }
  }
  if (!after_text) fail(path, "a TemplateProcessing single template without the sequence $A");
}

// An added token's id is not the file's "id": as the `tokenizers` package
// reads the list (0.23's AddedVocabulary::add_tokens, all in one batch, in
// the file's order), a token takes the id of its content in the model's
// vocab, or of an added token before it with that content, else the next
// id from the vocab's size on (its count of entries, not its largest id + 1).
// The last token given an id is the one matched and decoded. A file whose
// added ids overlap the vocab (an id of another token, content the vocab
// holds under another id, a list out of id order) thus reads with the ids
// `tokenizers` gives, and a warning (`tokenizers` logs one only where the
// vocab holds the content, which Python does not show).
void Tokenizer::Impl::read_added_tokens(const json& added) {
  struct Listed {
    AddedToken token;
    bool normalized;
  };
  std::map<uint32_t, Listed> last;  // by id: the last token given it
  std::unordered_map<std::string, uint32_t> added_ids;
  uint64_t next_id = by_name.size();  // by_name holds the vocab alone until the loop ends
  size_t moved = 0;
  std::string first_moved;
  for (const json& t : added) {
    const std::string content = t.at("content").get<std::string>();
    if (content.empty()) fail(path, "an added token has empty content");
    const uint32_t file_id = entry_id(path, "added token '" + content + "'", t.at("id"));
    uint32_t id = 0;
    if (const auto known = added_ids.find(content); known != added_ids.end()) {
      id = known->second;
    } else if (const auto in_vocab = by_name.find(content); in_vocab != by_name.end()) {
      id = in_vocab->second;
    } else {
      if (next_id >= kMaxTokenIds) {
        fail(path, "added token '" + content + "' takes id " + std::to_string(next_id) +
                       " (the next after the vocab), expected an id below " + std::to_string(kMaxTokenIds));
      }
      id = static_cast<uint32_t>(next_id++);
    }
    added_ids[content] = id;
    last[id] = {{content, id, t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)},
                t.value("normalized", !t.value("special", false))};
    if (id != file_id && moved++ == 0) {
      first_moved =
          "'" + content + "' (id " + std::to_string(file_id) + " in the file, given " + std::to_string(id) + ")";
    }
  }
  for (auto& [id, listed] : last) {
    AddedToken& token = listed.token;
    set_token(id, token.content, true);
    added_texts.emplace_back(token.content, token.rstrip);
    if (!listed.normalized) {
      raw_added.push_back(std::move(token));
      continue;
    }
    // Matched in the normalized text, so matched as the normalizer spells it (Prepend's "▁" included),
    // and decoded so, as `tokenizers` decodes it (Llama 2's "new token" as " new token").
    std::string scratch;
    token.content = std::string(normalize(token.content, /*continued=*/false, scratch));
    if (token.content.empty()) continue;
    names[id] = token.content;
    bytes[id] = decoded_name(token.content);
    normalized_added.push_back(std::move(token));
  }
  // Leftmost-longest matching tries the longer tokens first.
  for (auto* list : {&raw_added, &normalized_added}) {
    std::stable_sort(list->begin(), list->end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  }
  if (moved > 0) {
    warnings.push_back("tokenizer '" + path + "': " + std::to_string(moved) + " added token" + (moved > 1 ? "s" : "") +
                       " not given the id the file gives, the first " + first_moved +
                       ": as the `tokenizers` package reads it, an added token takes its content's id in the vocab, "
                       "else the next id after the vocab, in the file's order");
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
    if (!schemes.count(scheme)) {
      fail(path, "a Metaspace prepend_scheme of \"" + scheme + "\", expected always, first or never");
    }
    const std::string replacement = pre.value("replacement", std::string(kMetaspace));
    if (replacement.empty()) fail(path, "a Metaspace pre-tokenizer with an empty replacement");
    pre_tokenizer.add_metaspace(replacement, schemes.at(scheme), pre.value("split", true));
  } else {
    fail(path, "unsupported pre-tokenizer '" + type + "' (ByteLevel, Split, Metaspace or a Sequence of them)");
  }
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

}  // namespace fsdp::text
