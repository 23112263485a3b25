#pragma once
// Shared by the tests: a deterministic token file and a float comparison
// that says where two tensors differ.

#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "fsdp/gpt.h"
#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"

namespace fsdp::testing {

inline models::GPT make_gpt(const models::GPTConfig& config, uint64_t seed = 1) {
  models::GPT model(config);
  model->init_weights(seed);
  return model;
}

inline models::GPTConfig tiny() { return models::GPTConfig::preset("tiny"); }

// A unit per transformer block (the GPT's natural wrapping).
inline FullyShardOptions block_units(ShardingStrategy strategy = ShardingStrategy::kFullShard) {
  return FullyShardOptions().wrap_policy(module_type_policy<models::BlockImpl>()).strategy(strategy);
}

// The spec's AdamW.
inline torch::optim::AdamWOptions spec_adamw() {
  return torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
}

// A single-process reference's parameters, the tied weight once (LibTorch's
// parameters() lists it twice, and an optimizer given both would step it twice).
inline std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> params;
  for (const auto& p : unique_named_parameters(module)) params.push_back(p.second);
  return params;
}

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
