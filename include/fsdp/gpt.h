#pragma once
// The reference GPT of shared/spec/gpt.md: a GPT-2-style pre-LayerNorm
// decoder with learned positions and an lm head tied to the token embedding.

#include <torch/torch.h>

#include <string>

namespace fsdp::models {

struct GPTConfig {
  int64_t vocab = 256;
  int64_t context = 32;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t width = 64;
  int64_t batch = 4;  // per rank

  // "tiny", "small", "medium", "large" (shared/spec/gpt.md's table) or "xl"
  // (1.48 B parameters: vocab 256, context 1024, 48 layers, 25 heads, width
  // 1600, batch 1); throws for anything else.
  static GPTConfig preset(const std::string& name);
  void validate() const;
  std::string describe() const;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(MLP);

// One transformer block: the natural FSDP unit.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const GPTConfig& config);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

// logits = x @ weight^T, with `weight` registered as the very tensor it is
// tied to (the token embedding), so that both names are one parameter.
class TiedLMHeadImpl : public torch::nn::Module {
 public:
  explicit TiedLMHeadImpl(const torch::Tensor& tied_weight);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
};
TORCH_MODULE(TiedLMHead);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& config);
  // Mean cross-entropy of next-token prediction; idx and targets are [B, T] int64.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::Tensor logits(const torch::Tensor& idx);
  // The spec's seeded initialization; the same for every world size.
  void init_weights(uint64_t seed);
  // One parameter's initial values, drawn from the global RNG: init_weights
  // seeds it and calls this for every parameter in named order; sharded
  // initialization (FullyShardOptions::param_init_fn) calls it the same way.
  void init_parameter(const std::string& name, torch::Tensor& param) const;
  const GPTConfig& config() const { return config_; }
  int64_t num_parameters() const;  // tied weights counted once

  Transformer transformer{nullptr};
  TiedLMHead lm_head{nullptr};  // its weight IS transformer.wte.weight

 private:
  GPTConfig config_;
};
TORCH_MODULE(GPT);

}  // namespace fsdp::models
