// fsdp::text: the tokenizer's errors, its UTF-8 repair (Python's
// errors='replace'), BPE merge order, the SentencePiece-style unk path and
// restart points, added tokens' ids and decoding, and the trainer's limits.
// Identity with the `tokenizers` package is tested by tokenizer_reference.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "fsdp/tokenizer.h"
#include "text/utf8.h"

namespace {

using fsdp::text::Tokenizer;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "fsdp_text_" + std::to_string(::getpid()) + "_" + name;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The message of the exception `f` throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A byte-level BPE over the 256 bytes with merges a+b (rank 0), ab+a, Ġ+a
// (the first as "a b", the second as a pair), and <|endoftext|> as id 259
// (the next after the vocab's 259 entries, as `tokenizers` gives it).
std::string tiny_tokenizer_json(const nlohmann::json& model_extra = nlohmann::json::object(),
                                const nlohmann::json& normalizer = nullptr) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[fsdp::text::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["aba"] = 257;
  vocab["\u0120a"] = 258;
  nlohmann::json model = {{"type", "BPE"}, {"vocab", vocab},
                          {"merges", {"a b", nlohmann::json::array({"ab", "a"}), "\u0120 a"}}};
  model.update(model_extra);
  const nlohmann::json root = {
      {"normalizer", normalizer},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", {{{"id", 259}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", model}};
  return root.dump();
}

// A SentencePiece-style file as transformers' LlamaConverter writes one:
// <unk> <s> </s>, the 256 <0xNN> tokens (ids 3..258), then ▁ a b ▁a a▁ ab é
// (259..265), merges "▁ a", "a ▁", "a b"; normalizer Prepend + Replace.
nlohmann::json sentencepiece_tokenizer(bool byte_fallback, bool fuse_unk) {
  nlohmann::json root = nlohmann::json::parse(R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
                     {"id": 1, "content": "<s>", "special": true, "normalized": false},
                     {"id": 2, "content": "</s>", "special": true, "normalized": false}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "merges": ["\u2581 a", "a \u2581", "a b"]}})");
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  for (const char* t : {"\u2581", "a", "b", "\u2581a", "a\u2581", "ab", "\u00e9"}) vocab[t] = vocab.size();
  root["model"]["vocab"] = vocab;
  root["model"]["fuse_unk"] = fuse_unk;
  root["model"]["byte_fallback"] = byte_fallback;
  return root;
}

// The message reading `root` (written to a file `name`) throws.
std::string refusal(const std::string& name, const nlohmann::json& root) {
  return error_of([&] { Tokenizer t(write_file(name, root.dump())); });
}

TEST(TextTokenizer, MissingFileIsNamed) {
  const std::string message = error_of([] { Tokenizer("/nonexistent/tokenizer.json"); });
  EXPECT_NE(message.find("/nonexistent/tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot open"), std::string::npos) << message;
}

TEST(TextTokenizer, MalformedJsonIsRefused) {
  const std::string path = write_file("bad.json", "{\"model\": {\"type\": \"BPE\", ");
  const std::string message = error_of([&] { Tokenizer t(path); });
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(TextTokenizer, UnsupportedModelAndNormalizerAreRefused) {
  const std::string wordpiece = write_file("wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  EXPECT_NE(error_of([&] { Tokenizer t(wordpiece); }).find("unsupported model type 'WordPiece'"), std::string::npos);
  const std::string nfkc = write_file("nfkc.json", tiny_tokenizer_json(nlohmann::json::object(), {{"type", "NFKC"}}));
  EXPECT_NE(error_of([&] { Tokenizer t(nfkc); }).find("unsupported normalizer NFKC"), std::string::npos);
  const std::string fallback = write_file("fallback.json", tiny_tokenizer_json({{"byte_fallback", true}}));
  EXPECT_NE(error_of([&] { Tokenizer t(fallback); }).find("byte_fallback = true with a ByteLevel decoder"),
            std::string::npos);
  // SentencePiece-style parts outside what is read, each refused by name.
  nlohmann::json regex = sentencepiece_tokenizer(true, true);
  regex["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " {2,}"}};
  EXPECT_NE(refusal("regex.json", regex).find("unsupported normalizer Replace of pattern"), std::string::npos);
  nlohmann::json strip_first = sentencepiece_tokenizer(true, true);
  strip_first["decoder"]["decoders"] = nlohmann::json::parse(R"([{"type": "Strip", "content": " ", "start": 1, "stop": 0},
                                                                 {"type": "Fuse"}])");
  EXPECT_NE(refusal("strip.json", strip_first).find("unsupported decoder step"), std::string::npos);
  nlohmann::json unk = sentencepiece_tokenizer(true, true);
  unk["model"]["unk_token"] = "<missing>";
  EXPECT_NE(refusal("unk.json", unk).find("unk_token \"<missing>\" is not in the vocab"), std::string::npos);
  nlohmann::json processor = sentencepiece_tokenizer(true, true);
  processor["post_processor"] = {{"type", "ByteLevelPlus"}};
  EXPECT_NE(refusal("processor.json", processor).find("unsupported post-processor ByteLevelPlus"), std::string::npos);
}

// Without byte_fallback, characters outside the vocabulary become <unk>,
// one per run with fuse_unk (ids as the `tokenizers` package 0.23 gives);
// the template's <s> is read.
TEST(TextTokenizer, SentencePieceUnknownCharacters) {
  const Tokenizer fallback(write_file("spm_fallback.json", sentencepiece_tokenizer(true, true).dump()));
  EXPECT_EQ(fallback.encode("axyb"), (std::vector<uint32_t>{262, 123, 124, 261}));  // x, y: <0x78> <0x79>
  EXPECT_EQ(fallback.decode(fallback.encode("axyb")), "axyb");
  EXPECT_EQ(fallback.template_prefix_ids(), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(fallback.template_suffix_ids().empty());
  const Tokenizer fused(write_file("spm_fused.json", sentencepiece_tokenizer(false, true).dump()));
  EXPECT_EQ(fused.encode("axyb"), (std::vector<uint32_t>{262, 0, 261}));
  EXPECT_EQ(fused.encode("xy\u00e9"), (std::vector<uint32_t>{259, 0, 265}));
  const Tokenizer unfused(write_file("spm_unfused.json", sentencepiece_tokenizer(false, false).dump()));
  EXPECT_EQ(unfused.encode("axyb"), (std::vector<uint32_t>{262, 0, 0, 261}));
}

// A text cut at restart_point encodes as the whole does, the part after the
// cut with encode_continuation (no second "▁" prepended); no cut lands after
// a character a token joins to "▁" ("a▁" merges across "ba ba"'s space).
TEST(TextTokenizer, SentencePieceRestartPoints) {
  const Tokenizer t(write_file("spm_restart.json", sentencepiece_tokenizer(true, true).dump()));
  EXPECT_EQ(t.encode("ba ba"), (std::vector<uint32_t>{259, 261, 263, 261, 260}));  // ▁ b a▁ b a
  EXPECT_EQ(t.restart_point("ba ba", 4), 0u);
  const std::string text = "bb ba";
  const size_t cut = t.restart_point(text, 4);
  ASSERT_EQ(cut, 2u);
  std::vector<uint32_t> joined = t.encode(text.substr(0, cut));
  const std::vector<uint32_t> rest = t.encode_continuation(text.substr(cut));
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, t.encode(text));
  EXPECT_EQ(t.decode(t.encode(text.substr(0, cut))) + t.decode_continuation(rest), text);
  // Nor inside an added token, nor right after one that takes the whitespace after it.
  nlohmann::json added = sentencepiece_tokenizer(true, true);
  added["added_tokens"].push_back(nlohmann::json::parse(R"({"id": 266, "content": "b ab", "normalized": false})"));
  added["added_tokens"].push_back(
      nlohmann::json::parse(R"({"id": 267, "content": "<r>", "rstrip": true, "normalized": false})"));
  const Tokenizer with_added(write_file("spm_restart_added.json", added.dump()));
  EXPECT_EQ(with_added.restart_point("bb ab", 4), 0u);
  EXPECT_EQ(with_added.restart_point("x<r> ab", 6), 0u);
  EXPECT_EQ(with_added.restart_point("bb ba", 4), 2u);
}

TEST(TextTokenizer, MergesByRankAndSplitsAddedTokens) {
  const Tokenizer t(write_file("tiny.json", tiny_tokenizer_json()));
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_TRUE(t.warnings().empty());
  // Rank 0 (a b) merges both pairs of "abab" before rank 1 (ab a) could apply.
  EXPECT_EQ(t.encode("abab"), (std::vector<uint32_t>{256, 256}));
  EXPECT_EQ(t.encode("aba"), (std::vector<uint32_t>{257}));
  EXPECT_EQ(t.encode("ab<|endoftext|> a"), (std::vector<uint32_t>{256, 259, 258}));
  EXPECT_EQ(t.decode({256, 259, 258}), "ab<|endoftext|> a");
  EXPECT_EQ(t.token_id("<|endoftext|>"), std::optional<uint32_t>(259));
  EXPECT_EQ(t.token_id("Ġa"), std::optional<uint32_t>(258));
  EXPECT_FALSE(t.token_id("zzz").has_value());
  EXPECT_EQ(t.token_bytes(258), " a");
  EXPECT_NE(error_of([&] { t.token_bytes(260); }).find("outside its vocabulary of 260"), std::string::npos);
}

// As `tokenizers` decodes: an added token through the decoder as the vocab's
// tokens, a normalized one as the normalizer spells it.
TEST(TextTokenizer, AddedTokensDecodeAsTokenizersDecodes) {
  nlohmann::json byte_level = nlohmann::json::parse(tiny_tokenizer_json());
  byte_level["added_tokens"].push_back(
      nlohmann::json::parse(R"({"id": 260, "content": "\u0120b", "normalized": true})"));
  const Tokenizer t(write_file("added_decode.json", byte_level.dump()));
  EXPECT_EQ(t.encode("a\u0120b"), (std::vector<uint32_t>{97, 260}));
  EXPECT_EQ(t.token_bytes(260), " b");  // was "Ġb": the ByteLevel decoder maps it
  nlohmann::json spm = sentencepiece_tokenizer(true, true);
  spm["added_tokens"].push_back(nlohmann::json::parse(R"({"id": 266, "content": "a b", "normalized": true})"));
  const Tokenizer s(write_file("spm_added_decode.json", spm.dump()));
  EXPECT_EQ(s.token_bytes(266), " a b");  // "▁a▁b", as Prepend and Replace spell it
}

// An added token's id is the vocab's for its content, else the next after
// the vocab in the file's order, whatever the file says (as `tokenizers`):
// the file's ids here overlap the vocab, so each is warned of.
TEST(TextTokenizer, AddedTokensTakeTheIdsTokenizersGives) {
  nlohmann::json root = nlohmann::json::parse(tiny_tokenizer_json());
  root["added_tokens"] = nlohmann::json::parse(R"([
    {"id": 3, "content": "<x>", "special": true, "normalized": false},
    {"id": 5, "content": "ab", "special": false, "normalized": true},
    {"id": 263, "content": "<c>", "special": true, "normalized": false},
    {"id": 259, "content": "<a>", "special": true, "normalized": false},
    {"id": 260, "content": "\u0120b", "special": false, "normalized": true}])");
  const Tokenizer t(write_file("overlap.json", root.dump()));
  EXPECT_EQ(t.token_id("<x>"), std::optional<uint32_t>(259));  // id 3 is the byte 0x03's
  EXPECT_EQ(t.token_id("ab"), std::optional<uint32_t>(256));   // the vocab's id, not 5
  EXPECT_EQ(t.token_id("<c>"), std::optional<uint32_t>(260));  // in the file's order, not by id
  EXPECT_EQ(t.token_id("<a>"), std::optional<uint32_t>(261));
  EXPECT_EQ(t.encode("<a><x>ab<c>\u0120b"), (std::vector<uint32_t>{261, 259, 256, 260, 262}));
  EXPECT_EQ(t.token_bytes(3), "\x03");
  EXPECT_EQ(t.token_bytes(5), "\x05");
  EXPECT_EQ(t.token_bytes(262), " b");  // an added token decodes through the ByteLevel decoder too
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_NE(t.warnings()[0].find("5 added tokens not given the id the file gives, the first '<x>' (id 3 in the file, "
                                 "given 259)"),
            std::string::npos)
      << t.warnings()[0];
  // Llama 2's <unk> <s> </s>, in the vocab and added under the same ids: as they are, no warning.
  const Tokenizer llama(write_file("spm_added.json", sentencepiece_tokenizer(true, true).dump()));
  EXPECT_EQ(llama.token_id("</s>"), std::optional<uint32_t>(2));
  EXPECT_TRUE(llama.warnings().empty());
}

TEST(TextTokenizer, InvalidUtf8BecomesReplacementCharacters) {
  // Python: bytes.decode('utf-8', errors='replace'): one U+FFFD per maximal invalid subsequence.
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\x80z", "a" + fffd + "z"},
      {"\xE2\x82x", fffd + "x"},             // truncated 3-byte sequence: one
      {"\xF0\x9F\x98", fffd},                // truncated 4-byte at the end: one
      {"\xC0\xAF", fffd + fffd},             // overlong: each byte
      {"\xED\xA0\x80", fffd + fffd + fffd},  // surrogate: each byte
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},
      {"\xE2\x82\xAC ok", "\xE2\x82\xAC ok"},  // valid: unchanged
  };
  for (const auto& [in, expected] : cases) {
    std::string scratch;
    EXPECT_EQ(std::string(fsdp::text::valid_utf8(in, scratch)), expected);
  }
  const Tokenizer t(write_file("tiny2.json", tiny_tokenizer_json()));
  EXPECT_EQ(t.decode(t.encode("x\xFFy")), "x" + fffd + "y");
}

TEST(TextTokenizer, TrainerWritesATokenizerThatRoundTrips) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox jumps over the lazy dog, it's 1234 times.\n";
  const std::string corpus = write_file("corpus.txt", text);
  const std::string out = temp_path("trained.json");
  fsdp::text::train_bpe({corpus}, out, fsdp::text::BpeTrainerOptions().vocab_size(300));
  const Tokenizer t(out);
  EXPECT_EQ(t.vocab_size(), 300);
  EXPECT_EQ(t.token_id("<|endoftext|>"), std::optional<uint32_t>(0));
  const auto ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size() / 3);  // merges learned: fewer tokens than bytes
  EXPECT_EQ(t.decode(ids), text);
  const std::string message = error_of([&] {
    fsdp::text::train_bpe({corpus}, out, fsdp::text::BpeTrainerOptions().vocab_size(200));
  });
  EXPECT_NE(message.find("vocab_size 200 is below 256 bytes + 1 special tokens"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { fsdp::text::train_bpe({"/nonexistent.txt"}, out, {}); }).find("/nonexistent.txt"),
            std::string::npos);
}

}  // namespace
