// Single-threaded encode throughput of fsdp::text::Tokenizer: the file's text
// in chunks of `lines` lines, encoded one after another, `reps` times (the
// piece cache persists across reps, as the `tokenizers` one does in
// bench/tokenizer.py). Prints JSON: bytes, tokens, best and median seconds, MB/s.
//   fsdp-bench-tokenizer TOKENIZER_JSON TEXT_FILE [LINES=1000] [REPS=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [LINES] [REPS]\n", argv[0]);
    return 2;
  }
  const int lines = argc > 3 ? std::stoi(argv[3]) : 1000, reps = argc > 4 ? std::stoi(argv[4]) : 3;
  const fsdp::text::Tokenizer tokenizer(argv[1]);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::string> chunks;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = start;
    for (int n = 0; n < lines && end < text.size(); ++n) {
      const size_t newline = text.find('\n', end);
      end = newline == std::string::npos ? text.size() : newline + 1;
    }
    chunks.push_back(text.substr(start, end - start));
    start = end;
  }
  std::vector<double> seconds;
  size_t tokens = 0;
  for (int r = 0; r < reps; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& chunk : chunks) tokens += tokenizer.encode(chunk).size();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf("{\"impl\": \"fsdp-cpp\", \"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.4f, \"median_s\": %.4f, "
              "\"MB_per_s\": %.2f}\n",
              text.size(), tokens, seconds.front(), median, text.size() / 1e6 / median);
  return 0;
}
