#pragma once
// Shared by the tests: a deterministic token file and a float comparison
// that says where two tensors differ.

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace fsdp::testing {

// A pseudo-text token file (bytes < vocab), the same on every rank. Written
// under a per-process name and renamed, so ranks never read a half file.
inline std::string make_token_file(const std::string& name, int64_t n, int64_t vocab, uint64_t seed = 7) {
  std::string path = "/tmp/fsdp_test_" + name + ".txt";
  std::string temp = path + "." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary);
    uint64_t state = seed;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      // Skewed towards small ids, so the model has something to learn.
      uint64_t r = (state >> 33) % static_cast<uint64_t>(vocab);
      out.put(static_cast<char>((r * r) / static_cast<uint64_t>(vocab)));
    }
  }
  std::rename(temp.c_str(), path.c_str());
  return path;
}

inline double max_relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

}  // namespace fsdp::testing
