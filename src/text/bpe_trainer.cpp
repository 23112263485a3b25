// fsdp::text::train_bpe: byte-level BPE training on counts of pre-tokenized
// words (GPT-2's regex), with pair counts updated incrementally after each
// merge, written as a GPT-2-style tokenizer.json.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/tokenizer.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace fsdp::text {

namespace {

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
uint32_t left_of(uint64_t key) { return static_cast<uint32_t>(key >> 32); }
uint32_t right_of(uint64_t key) { return static_cast<uint32_t>(key & 0xFFFFFFFFu); }

struct Word {
  std::vector<uint32_t> symbols;
  int64_t count;
};

using WordCounts = std::unordered_map<std::string, int64_t>;

// Adds the pre-tokenized words of `text` to `counts`, special tokens left out.
void count_text(const PreTokenizer& pre, std::string_view text, const std::vector<std::string>& specials,
                WordCounts& counts) {
  const auto count_piece = [&](std::string_view piece) { ++counts[std::string(piece)]; };
  size_t start = 0;
  while (start < text.size()) {  // the text between special tokens
    size_t next = text.size(), length = 0;
    for (const auto& s : specials) {
      const size_t at = text.find(s, start);
      if (at < next) { next = at; length = s.size(); }
    }
    pre.for_each_piece(text.substr(start, next - start), PreTokenizer::Start::kText, count_piece);
    start = next + length;
  }
}

// `text` cut into about `parts` parts, each cut between an ASCII letter and
// " letter", where GPT-2's pattern starts a piece anyway.
std::vector<std::string_view> split_for_threads(std::string_view text, size_t parts) {
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t k = 1; k < parts; ++k) {
    size_t p = std::max(start + 1, text.size() * k / parts);
    while (p + 1 < text.size() && !(text[p] == ' ' && letter(text[p - 1]) && letter(text[p + 1]))) ++p;
    if (p + 1 >= text.size()) break;
    out.push_back(text.substr(start, p - start));
    start = p;
  }
  out.push_back(text.substr(start));
  return out;
}

// Counts the pre-tokenized words of the files on `threads` threads.
WordCounts count_words(const std::vector<std::string>& files, const std::vector<std::string>& specials, int threads) {
  PreTokenizer pre;
  pre.add_byte_level(false, true);
  const size_t workers = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  WordCounts counts;
  for (const std::string& file : files) {
    // A directory opens, and reads as nothing (an empty tokenizer); a named pipe blocks.
    const auto status = std::filesystem::status(file);
    if (std::filesystem::is_directory(status)) {
      throw std::runtime_error("train_bpe: the text file '" + file + "' is a directory, expected a file");
    }
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      throw std::runtime_error("train_bpe: the text file '" + file + "' is not a regular file");
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("train_bpe: cannot open the text file '" + file + "'");
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string raw = buffer.str();
    std::string scratch;
    const std::string_view text = valid_utf8(raw, scratch);
    const auto parts = split_for_threads(text, text.size() > (1u << 20) ? workers : 1);
    std::vector<WordCounts> partial(parts.size());
    std::vector<std::thread> running;
    for (size_t i = 1; i < parts.size(); ++i) {
      running.emplace_back([&, i] { count_text(pre, parts[i], specials, partial[i]); });
    }
    count_text(pre, parts[0], specials, partial[0]);
    for (auto& t : running) t.join();
    for (const auto& part : partial) {
      for (const auto& [word, n] : part) counts[word] += n;
    }
  }
  return counts;
}

class Trainer {
 public:
  Trainer(const BpeTrainerOptions& options) : options_(options) {
    for (const auto& s : options.special_tokens()) add_token(s);
    for (int b = 0; b < 256; ++b) add_token(std::string(1, static_cast<char>(b)));
  }
  void train(const std::unordered_map<std::string, int64_t>& word_counts);
  void write(const std::string& path) const;

 private:
  uint32_t add_token(const std::string& bytes) {
    tokens_.push_back(bytes);
    return static_cast<uint32_t>(tokens_.size() - 1);
  }
  // Max-heap order: the larger count, then the smaller pair of token strings.
  bool before(const std::pair<int64_t, uint64_t>& x, const std::pair<int64_t, uint64_t>& y) const {
    if (x.first != y.first) return x.first < y.first;
    const auto& xa = tokens_[left_of(x.second)], &ya = tokens_[left_of(y.second)];
    if (xa != ya) return xa > ya;
    return tokens_[right_of(x.second)] > tokens_[right_of(y.second)];
  }
  void add_pairs(uint32_t word, int64_t sign, std::unordered_set<uint64_t>& changed);
  void merge(uint64_t pair, uint32_t merged);

  BpeTrainerOptions options_;
  std::vector<std::string> tokens_;  // by id: its bytes (special tokens: their text)
  std::vector<uint64_t> merges_;
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::unordered_set<uint32_t>> pair_words_;  // may hold stale words
  std::vector<std::pair<int64_t, uint64_t>> heap_;                         // lazy: counts checked when popped
};

void Trainer::add_pairs(uint32_t word, int64_t sign, std::unordered_set<uint64_t>& changed) {
  const Word& w = words_[word];
  for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
    const uint64_t key = pair_key(w.symbols[i], w.symbols[i + 1]);
    pair_counts_[key] += sign * w.count;
    if (sign > 0) pair_words_[key].insert(word);
    changed.insert(key);
  }
}

void Trainer::merge(uint64_t pair, uint32_t merged) {
  const uint32_t a = left_of(pair), b = right_of(pair);
  std::unordered_set<uint64_t> changed;
  const std::vector<uint32_t> words(pair_words_[pair].begin(), pair_words_[pair].end());
  for (const uint32_t w : words) {
    auto& symbols = words_[w].symbols;
    bool found = false;
    for (size_t i = 0; i + 1 < symbols.size() && !found; ++i) found = symbols[i] == a && symbols[i + 1] == b;
    if (!found) continue;
    add_pairs(w, -1, changed);
    size_t out = 0;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        symbols[out++] = merged;
        ++i;
      } else {
        symbols[out++] = symbols[i];
      }
    }
    symbols.resize(out);
    add_pairs(w, +1, changed);
  }
  const auto order = [this](const auto& x, const auto& y) { return before(x, y); };
  for (const uint64_t key : changed) {
    const int64_t count = pair_counts_[key];
    if (count > 0) {
      heap_.emplace_back(count, key);
      std::push_heap(heap_.begin(), heap_.end(), order);
    }
  }
}

void Trainer::train(const std::unordered_map<std::string, int64_t>& word_counts) {
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());  // the same words in the same order on every run
  const uint32_t first_byte = static_cast<uint32_t>(options_.special_tokens().size());
  std::unordered_set<uint64_t> changed;
  for (const auto& [word, count] : sorted) {
    Word w{{}, count};
    for (const char c : word) w.symbols.push_back(first_byte + static_cast<unsigned char>(c));
    words_.push_back(std::move(w));
    add_pairs(static_cast<uint32_t>(words_.size() - 1), +1, changed);
  }
  const auto order = [this](const auto& x, const auto& y) { return before(x, y); };
  for (const uint64_t key : changed) heap_.emplace_back(pair_counts_[key], key);
  std::make_heap(heap_.begin(), heap_.end(), order);
  std::unordered_map<std::string, uint32_t> by_bytes;
  for (uint32_t id = first_byte; id < tokens_.size(); ++id) by_bytes.emplace(tokens_[id], id);
  int64_t vocab = static_cast<int64_t>(tokens_.size());
  while (vocab < options_.vocab_size() && !heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), order);
    const auto [count, key] = heap_.back();
    heap_.pop_back();
    const int64_t now = pair_counts_[key];
    if (now != count) continue;  // stale: a fresher entry holds the current count
    if (count < options_.min_frequency() || count <= 0) break;
    const std::string bytes = tokens_[left_of(key)] + tokens_[right_of(key)];
    auto [entry, inserted] = by_bytes.emplace(bytes, 0);
    if (inserted) {
      entry->second = add_token(bytes);
      ++vocab;
    }
    merges_.push_back(key);
    merge(key, entry->second);
  }
}

void Trainer::write(const std::string& path) const {
  using ordered = nlohmann::ordered_json;
  const size_t specials = options_.special_tokens().size();
  const auto name = [&](uint32_t id) { return id < specials ? tokens_[id] : bytes_to_byte_level(tokens_[id]); };
  ordered added = ordered::array(), vocab = ordered::object(), merges = ordered::array();
  for (uint32_t id = 0; id < specials; ++id) {
    added.push_back({{"id", id}, {"content", tokens_[id]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  for (uint32_t id = 0; id < tokens_.size(); ++id) vocab[name(id)] = id;
  for (const uint64_t key : merges_) merges.push_back(name(left_of(key)) + " " + name(right_of(key)));
  const ordered byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                              {"use_regex", true}};
  ordered root = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
                  {"normalizer", nullptr}, {"pre_tokenizer", byte_level}, {"post_processor", byte_level},
                  {"decoder", byte_level}};
  root["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                   {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}};
  // Written beside, then renamed: a failed write leaves no half a tokenizer.
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("train_bpe: cannot write '" + path + "'");
  out << root.dump(2) << "\n";
  out.close();
  if (!out || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw std::runtime_error("train_bpe: cannot write '" + path + "'");
  }
}

}  // namespace

void train_bpe(const std::vector<std::string>& files, const std::string& tokenizer_json_out,
               const BpeTrainerOptions& options) {
  const int64_t minimum = 256 + static_cast<int64_t>(options.special_tokens().size());
  if (options.vocab_size() < minimum) {
    throw std::runtime_error("train_bpe: vocab_size " + std::to_string(options.vocab_size()) +
                             " is below 256 bytes + " + std::to_string(options.special_tokens().size()) +
                             " special tokens = " + std::to_string(minimum));
  }
  if (static_cast<uint64_t>(options.vocab_size()) > kMaxTokenIds) {
    throw std::runtime_error("train_bpe: vocab_size " + std::to_string(options.vocab_size()) + " is above " +
                             std::to_string(kMaxTokenIds) + ", the most ids a tokenizer.json is read with");
  }
  if (files.empty()) throw std::runtime_error("train_bpe: no text files given");
  const auto start = std::chrono::steady_clock::now();
  const auto counts = count_words(files, options.special_tokens(), options.threads());
  Trainer trainer(options);
  trainer.train(counts);
  trainer.write(tokenizer_json_out);
  if (options.verbose()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "train_bpe: %zu distinct words, wrote %s in %.2f s\n", counts.size(),
                 tokenizer_json_out.c_str(), seconds);
  }
}

}  // namespace fsdp::text
