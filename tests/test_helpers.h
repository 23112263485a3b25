#pragma once
// Shared by the tests: a deterministic token file, GPT configurations, a
// float comparison that says where two tensors differ, a sharded
// model's gradients gathered and compared with a single process's, an
// error's text, and whole files as bytes. The multi-rank helpers are in
// sharded_test_helpers.h.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/model_config.h"
#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"
#include "core/unit_plan.h"

namespace fsdp::testing {

// The text of the error `f` throws ("<no error>" if it throws none).
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return fsdp::error_message(e);
  }
  return "<no error>";
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// `v` as 8 little-endian bytes (a safetensors header's length).
inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

inline models::GPT make_gpt(const models::GPTConfig& config, uint64_t seed = 1) {
  models::GPT model(config);
  model->init_weights(seed);
  return model;
}

inline models::GPTConfig tiny() { return models::GPTConfig::preset("tiny"); }

// A GPT whose every unit pads at W = 2, 3 and 4 alike (the presets' units,
// C a multiple of 64, divide by 2 and 4): with width C = 35 and context
// T = 17, the root's C(vocab + T + 2) = 35 * 275 = 9625 elements and a
// block's 12C^2 + 13C = 35 * 433 = 15155 are odd and not multiples of 3.
inline models::GPTConfig uneven() {
  models::GPTConfig c;
  c.vocab = 256, c.context = 17, c.layers = 2, c.heads = 5, c.width = 35, c.batch = 2;
  return c;
}

// A Llama with every switch of the hub's families on at once (llama.h):
// the head tied to the embedding, biases on q, k, v and o, per-head q/k
// norms, a head_dim (10) that is not width / heads (35 / 4), llama3 rope
// scaling whose wavelengths (6 to 10^4 positions against an original
// context of 64) fall in all three of its bands, and a sliding window as
// long as the context. Its units pad at W = 2, 3 and 4 as uneven()'s do:
// the root (257 C = 8995 elements, the head tied) and a decoder layer
// (9445) are odd and not multiples of 3.
inline models::LlamaConfig every_switch_llama() {
  models::LlamaConfig c;
  c.vocab = 256, c.context = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 35, c.hidden = 48, c.batch = 2;
  c.tie_word_embeddings = c.attention_bias = c.qkv_bias = c.qk_norm = true;
  c.explicit_head_dim = 10;
  c.rope_scaling.kind = models::RopeScaling::Kind::kLlama3;
  c.rope_scaling.factor = 8.0, c.rope_scaling.original_context = 64;
  c.sliding_window = c.context;
  return c;
}

// A model of any family, initialized from `seed` (init_weights).
inline std::shared_ptr<models::LanguageModel> make_model(const models::ModelConfig& config, uint64_t seed = 1) {
  std::shared_ptr<models::LanguageModel> model = config.new_model();
  model->init_weights(seed);
  return model;
}

// The GPT's unit sizes (block units) from the spec's shapes, not from the
// library: the root (wte, wpe, ln_f), then each block.
inline std::vector<int64_t> gpt_unit_numels(const models::GPTConfig& c) {
  const int64_t C = c.width;
  std::vector<int64_t> numels = {c.vocab * C + c.context * C + 2 * C};
  for (int64_t i = 0; i < c.layers; ++i) numels.push_back(12 * C * C + 13 * C);
  return numels;
}

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

// The padding at the end of a unit's whole (gathered) flat buffer.
inline torch::Tensor padding_of(const FlatParam& flat, const torch::Tensor& full) {
  return full.narrow(0, flat.numel(), flat.padded_numel() - flat.numel());
}

// Each unit's reduced gradient, gathered over its shard group, against the
// same parameter's gradient in a single-process reference, to a relative
// tolerance; and the padding's gradient exactly zero (it would otherwise
// count in the clipping norm and move the padding). Works for every
// strategy: a rank's shard().grad() is its slice of the unit (the whole unit
// for no_shard), whether the strategy keeps the rest (zero1) or not.
// Collective: every rank of the model's world must call it.
inline void expect_gradients_match(const FsdpState& state, const torch::nn::Module& reference, double tolerance,
                                   const std::string& context = "") {
  const auto expected_grads = reference.named_parameters();
  for (const auto& unit : fsdp::detail::units(state)) {
    const auto& flat = unit->flat_param();
    if (flat.entries().empty()) continue;
    torch::Tensor local = flat.shard().grad();
    if (!local.defined()) {
      ADD_FAILURE() << "unit " << unit->display_name() << " got no gradient" << context;
      local = torch::full_like(flat.shard(), std::nan(""));  // still gathered: the other ranks wait on it
    }
    const torch::Tensor full = flat.gather_full(local);
    for (const auto& e : flat.entries()) {
      const torch::Tensor expected = expected_grads[e.name].grad();
      EXPECT_LT(max_relative_difference(full.narrow(0, e.offset, e.numel).view(e.shape), expected), tolerance)
          << "gradient of " << e.name << context;
    }
    EXPECT_TRUE(padding_of(flat, full).eq(0).all().item<bool>())
        << "gradient of unit " << unit->display_name() << "'s padding" << context;
  }
}

}  // namespace fsdp::testing
