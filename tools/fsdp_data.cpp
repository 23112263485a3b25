// fsdp-data: trains a byte-level BPE tokenizer, encodes text files into token
// files (streaming, on several threads; each file a document), decodes and
// inspects token files.
//
// Token files: .bin is nanoGPT's (little-endian uint16 ids, no header); .u32
// is little-endian uint32 ids, no header, for vocabularies over 65,536.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/strings.h"
#include "fsdp/tokenizer.h"
#include "fsdp_data_chat.h"
#include "tool_support.h"

namespace {

using fsdp::text::Tokenizer;
using Clock = std::chrono::steady_clock;

// A tokenizer.json, its warnings printed (ids given to two tokens, say).
Tokenizer load_tokenizer(const std::string& path) {
  Tokenizer tokenizer(path);
  for (const std::string& warning : tokenizer.warnings()) std::cerr << "fsdp-data: warning: " << warning << "\n";
  return tokenizer;
}

using fsdp::ends_with;

// Bytes per id of a token file, from its name: .bin 2, .u32 4.
int token_width(const std::string& path) {
  if (ends_with(path, ".bin")) return 2;
  if (ends_with(path, ".u32")) return 4;
  throw std::runtime_error("token file '" + path + "': expected a name ending in .bin (uint16 ids) or .u32 (uint32 ids)");
}

void check_width(const std::string& path, int width, int64_t vocab_size) {
  if (width == 2 && vocab_size > 65536) {
    throw std::runtime_error("the vocabulary of " + std::to_string(vocab_size) + " tokens does not fit '" + path +
                             "': .bin holds uint16 ids (a vocabulary of at most 65536); write a .u32 file instead");
  }
}

void append_ids(const std::vector<uint32_t>& ids, int width, std::string& out) {
  for (const uint32_t id : ids) {
    for (int k = 0; k < width; ++k) out += static_cast<char>((id >> (8 * k)) & 0xFF);
  }
}

// A cut at a UTF-8 character boundary near `limit`, when no newline cut exists.
size_t character_cut(const std::string& text, size_t limit) {
  size_t p = std::min(limit, text.size());
  while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
  return p > 0 ? p : std::min(limit, text.size());
}

// Reads the files as chunks of about `chunk_bytes`, each ending where the
// tokenizer may restart (Tokenizer::restart_point).
class ChunkReader {
 public:
  ChunkReader(const Tokenizer& tokenizer, std::vector<std::string> files, size_t chunk_bytes)
      : tokenizer_(tokenizer), files_(std::move(files)), initial_(chunk_bytes), chunk_(chunk_bytes) {}
  // The next chunk, whether it starts and whether it ends its file; false when all are read.
  bool next(std::string& chunk, bool& starts_file, bool& ends_file) {
    while (true) {
      if (!in_.is_open()) {
        if (file_ >= files_.size()) return false;
        in_.open(files_[file_], std::ios::binary);
        if (!in_) throw std::runtime_error("cannot open '" + files_[file_] + "': " + std::strerror(errno));
        pending_.clear();
        starts_file_ = true;
      }
      fill();
      if (in_.bad()) throw std::runtime_error("cannot read '" + files_[file_] + "': " + std::strerror(errno));
      const bool at_end = in_.eof();
      if (at_end && pending_.size() <= chunk_) {
        chunk.swap(pending_);
        pending_.clear();
        starts_file = starts_file_;
        ends_file = true;
        in_.close();
        ++file_;
        return true;
      }
      size_t cut = tokenizer_.restart_point(pending_, chunk_);
      if (cut == 0 && chunk_ < 16 * initial_ && !at_end) { chunk_ *= 2; continue; }  // a long line: read on
      if (cut == 0) cut = character_cut(pending_, chunk_);
      chunk.assign(pending_, 0, cut);
      pending_.erase(0, cut);
      chunk_ = initial_;
      starts_file = starts_file_;
      starts_file_ = false;
      ends_file = false;
      return true;
    }
  }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  void fill() {
    const size_t want = chunk_ + 1;
    if (pending_.size() >= want || in_.eof()) return;
    const size_t have = pending_.size();
    pending_.resize(want);
    in_.read(pending_.data() + have, static_cast<std::streamsize>(want - have));
    pending_.resize(have + static_cast<size_t>(in_.gcount()));
    bytes_read_ += static_cast<uint64_t>(in_.gcount());
  }
  const Tokenizer& tokenizer_;
  std::vector<std::string> files_;
  size_t initial_, chunk_;
  size_t file_ = 0;
  bool starts_file_ = true;
  std::ifstream in_;
  std::string pending_;
  uint64_t bytes_read_ = 0;
};

uint64_t total_bytes(const std::vector<std::string>& files) {
  uint64_t total = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary | std::ios::ate);
    if (!in) throw std::runtime_error("cannot open '" + f + "': " + std::strerror(errno));
    total += static_cast<uint64_t>(in.tellg());
  }
  return total;
}

struct EncodeOptions {
  std::string tokenizer, output, eot_token = "<|endoftext|>";
  std::vector<std::string> files;
  int threads = 0;
  bool append_eot = false, add_special_tokens = false, print_ids = false, quiet = false;
  size_t chunk_bytes = size_t{4} << 20;
};

class Progress {
 public:
  Progress(uint64_t total, bool quiet) : total_(total), quiet_(quiet) {}
  void report(uint64_t bytes, uint64_t tokens, bool final) {
    const auto now = Clock::now();
    if (quiet_ || (!final && now - last_ < std::chrono::seconds(1))) return;
    if (!final && bytes == total_) return;  // the final line says it
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "fsdp-data encode: %.1f of %.1f MB, %llu tokens, %.2f MB/s%s", bytes / 1e6, total_ / 1e6,
                 static_cast<unsigned long long>(tokens), seconds > 0 ? bytes / 1e6 / seconds : 0.0,
                 final ? "\n" : "\r");
  }

 private:
  uint64_t total_;
  bool quiet_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// Encodes a batch of chunks, one thread each, into ids in order; a chunk
// that does not start its file continues the one before.
void encode_batch(const Tokenizer& tokenizer, const std::vector<std::string>& chunks, const std::vector<char>& starts,
                  std::vector<std::vector<uint32_t>>& ids) {
  ids.assign(chunks.size(), {});
  // A chunk's error (a pre-tokenizer regex past its bound) is rethrown here,
  // once every thread has ended: thrown out of a thread it would abort the program.
  std::vector<std::exception_ptr> errors(chunks.size());
  const auto encode_chunk = [&](size_t i) {
    try {
      ids[i] = starts[i] ? tokenizer.encode(chunks[i]) : tokenizer.encode_continuation(chunks[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  for (size_t i = 1; i < chunks.size(); ++i) workers.emplace_back(encode_chunk, i);
  if (!chunks.empty()) encode_chunk(0);
  for (auto& w : workers) w.join();
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
}

int encode(const EncodeOptions& o) {
  for (const auto& f : o.files) fsdp_tools::require_regular_file(f, "the text file");
  const Tokenizer tokenizer = load_tokenizer(o.tokenizer);
  const int width = o.print_ids ? 0 : token_width(o.output);
  if (width) check_width(o.output, width, tokenizer.vocab_size());
  std::optional<uint32_t> eot;
  if (o.append_eot) {
    eot = tokenizer.token_id(o.eot_token);
    if (!eot) throw std::runtime_error("--append-eot: the tokenizer has no token '" + o.eot_token + "'");
  }
  std::optional<fsdp_tools::OutputFile> out;  // renamed into place once every file is encoded
  if (width) out.emplace(o.output);
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ChunkReader reader(tokenizer, o.files, o.chunk_bytes);
  Progress progress(total_bytes(o.files), o.quiet);
  uint64_t tokens = 0;
  std::vector<std::string> chunks;
  std::vector<char> starts, ends;
  std::vector<std::vector<uint32_t>> ids;
  std::string bytes;
  bool more = true;
  while (more) {
    chunks.clear();
    starts.clear();
    ends.clear();
    std::string chunk;
    bool starts_file = false, ends_file = false;
    while (static_cast<int>(chunks.size()) < threads && (more = reader.next(chunk, starts_file, ends_file))) {
      chunks.push_back(std::move(chunk));
      starts.push_back(starts_file);
      ends.push_back(ends_file);
    }
    encode_batch(tokenizer, chunks, starts, ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (o.add_special_tokens && starts[i]) {
        const auto& prefix = tokenizer.template_prefix_ids();
        ids[i].insert(ids[i].begin(), prefix.begin(), prefix.end());
      }
      if (o.add_special_tokens && ends[i]) {
        const auto& suffix = tokenizer.template_suffix_ids();
        ids[i].insert(ids[i].end(), suffix.begin(), suffix.end());
      }
      if (eot && ends[i]) ids[i].push_back(*eot);
      tokens += ids[i].size();
      if (o.print_ids) {
        for (const uint32_t id : ids[i]) std::cout << id << '\n';
      } else {
        bytes.clear();
        append_ids(ids[i], width, bytes);
        out->stream().write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      }
    }
    progress.report(reader.bytes_read(), tokens, false);
  }
  progress.report(reader.bytes_read(), tokens, true);
  if (out) out->commit();
  return 0;
}

// Calls `visit` with each id of a token file, read a block at a time.
template <typename Visit>
void for_each_token(const std::string& path, Visit visit) {
  const int width = token_width(path);
  fsdp_tools::require_regular_file(path, "the token file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  std::vector<unsigned char> block(size_t{1} << 20);
  uint64_t index = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(block.data()), static_cast<std::streamsize>(block.size()));
    if (in.bad()) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
    const size_t got = static_cast<size_t>(in.gcount());
    if (got % width) throw std::runtime_error("token file '" + path + "' does not hold whole " + std::to_string(width) + "-byte ids");
    for (size_t i = 0; i < got; i += width) {
      uint32_t id = 0;
      for (int k = 0; k < width; ++k) id |= uint32_t{block[i + k]} << (8 * k);
      visit(index++, id);
    }
  }
}

int decode(const std::string& tokenizer_path, const std::string& path) {
  const Tokenizer tokenizer = load_tokenizer(tokenizer_path);
  std::vector<uint32_t> block;
  bool first_block = true;
  const auto flush = [&] {
    std::cout << (first_block ? tokenizer.decode(block) : tokenizer.decode_continuation(block));
    first_block = false;
    block.clear();
  };
  for_each_token(path, [&](uint64_t, uint32_t id) {
    block.push_back(id);
    if (block.size() >= (1u << 18)) flush();
  });
  if (!block.empty()) flush();
  return 0;
}

int inspect(const std::string& path, const std::string& tokenizer_path, int top, int first) {
  std::map<uint32_t, uint64_t> counts;
  uint64_t count = 0;
  uint32_t max_id = 0;
  std::vector<uint32_t> head;
  for_each_token(path, [&](uint64_t i, uint32_t id) {
    ++count;
    ++counts[id];
    max_id = std::max(max_id, id);
    if (i < static_cast<uint64_t>(first)) head.push_back(id);
  });
  std::cout << "file: " << path << "\ntokens: " << count << "\nwidth: " << token_width(path) * 8
            << "-bit little-endian\nmax id: " << max_id << "\ndistinct ids: " << counts.size() << "\n";
  std::vector<std::pair<uint64_t, uint32_t>> by_count;
  for (const auto& [id, n] : counts) by_count.emplace_back(n, id);
  std::sort(by_count.begin(), by_count.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::optional<Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) tokenizer.emplace(load_tokenizer(tokenizer_path));
  const auto shown = [&](uint32_t id) {
    if (!tokenizer || id >= tokenizer->vocab_size()) return std::string();
    return " " + CLI::detail::to_string(std::quoted(tokenizer->token_bytes(id)));
  };
  std::cout << "top " << top << " ids:\n";
  for (int k = 0; k < top && k < static_cast<int>(by_count.size()); ++k) {
    std::cout << "  " << by_count[k].second << " x" << by_count[k].first << shown(by_count[k].second) << "\n";
  }
  std::cout << "first " << head.size() << " ids:";
  for (const uint32_t id : head) std::cout << " " << id;
  std::cout << "\n";
  if (tokenizer) std::cout << "first tokens decoded: " << std::quoted(tokenizer->decode(head)) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train tokenizers, encode text files and conversations into token files, decode and inspect token files."};
  app.require_subcommand(1);
  auto* train = app.add_subcommand("train-tokenizer", "train a byte-level BPE (GPT-2's pre-tokenization) into a tokenizer.json");
  std::vector<std::string> files;
  std::string output;
  int64_t vocab_size = 4096, min_frequency = 2;
  std::vector<std::string> special{"<|endoftext|>"};
  int threads = 0;
  train->add_option("--vocab-size", vocab_size, "tokens in all: 256 bytes, special tokens, merges")
      ->check(fsdp_tools::positive())
      ->capture_default_str();
  train->add_option("--min-frequency", min_frequency, "merge only pairs seen at least this often")
      ->check(fsdp_tools::positive())
      ->capture_default_str();
  train->add_option("--special", special, "special tokens, ids 0.. in order")->capture_default_str();
  train->add_option("--threads", threads, "word-counting threads, for files over 1 MiB (0: one per core)")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  train->add_option("-o,--output", output, "the tokenizer.json to write")->required();
  train->add_option("files", files, "text files (UTF-8; invalid bytes read as U+FFFD)")->required();
  auto* enc = app.add_subcommand("encode", "encode text files into one token file (.bin uint16 or .u32 uint32)");
  EncodeOptions eo;
  enc->add_option("--tokenizer", eo.tokenizer, "tokenizer.json")->required();
  enc->add_option("-o,--output", eo.output, "token file: NAME.bin (uint16, nanoGPT's) or NAME.u32 (uint32)");
  enc->add_option("--threads", eo.threads, "encoding threads (0: one per core)")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  enc->add_flag("--add-special-tokens", eo.add_special_tokens,
                "put what the tokenizer's post-processor adds around each file (a document): Llama 2's <s>, "
                "Llama 3's <|begin_of_text|>, an EOS if its template has one");
  enc->add_flag("--append-eot", eo.append_eot, "append the end-of-text token (--eot-token) after each file");
  enc->add_option("--eot-token", eo.eot_token, "the end-of-text token")->capture_default_str();
  enc->add_flag("--print-ids", eo.print_ids, "print the ids, one a line, instead of writing a file");
  enc->add_option("--chunk-bytes", eo.chunk_bytes, "bytes per chunk a thread encodes (at most 1 GiB: a thread holds a few)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  enc->add_flag("-q,--quiet", eo.quiet, "no progress on stderr");
  enc->add_option("files", eo.files, "text files")->required();
  auto* dec = app.add_subcommand("decode", "write a token file's text to stdout");
  std::string tokenizer_path, path;
  dec->add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  dec->add_option("file", path, "token file (.bin or .u32)")->required();
  auto* insp = app.add_subcommand("inspect", "count, width, max id, the most frequent ids, the first tokens");
  int top = 10, first = 32;
  insp->add_option("file", path, "token file (.bin or .u32)")->required();
  insp->add_option("--tokenizer", tokenizer_path, "tokenizer.json, to show tokens as text");
  insp->add_option("--top", top, "how many of the most frequent ids")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  insp->add_option("--first", first, "how many ids from the start")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  fsdp_data::ChatOptions co;
  const auto [enc_chat, render] = fsdp_data::add_chat_subcommands(app, co);
  if (const auto status = fsdp_tools::parse_command_line(app, argc, argv)) return *status;
  try {
    if (train->parsed()) {
      const auto options = fsdp::text::BpeTrainerOptions().vocab_size(vocab_size).min_frequency(min_frequency);
      fsdp::text::train_bpe(files, output, fsdp::text::BpeTrainerOptions(options).special_tokens(special).threads(threads).verbose(true));
      return 0;
    }
    if (enc->parsed()) {
      if (eo.output.empty() == !eo.print_ids) throw std::runtime_error("encode: give -o FILE or --print-ids (one of them)");
      return encode(eo);
    }
    if (dec->parsed()) return decode(tokenizer_path, path);
    if (enc_chat->parsed()) return fsdp_data::encode_chat(co);
    if (render->parsed()) return fsdp_data::render_chat(co);
    return inspect(path, tokenizer_path, top, first);
  } catch (const std::exception& e) {
    std::cerr << "fsdp-data: error: " << e.what() << "\n";
    return fsdp_tools::kExitError;
  }
}
