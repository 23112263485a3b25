#pragma once
/// \file
/// The reference GPT of shared/spec/gpt.md: a GPT-2-style pre-LayerNorm
/// decoder with learned positions and an lm head tied to the token embedding.

#include <torch/torch.h>

#include <string>

#include "fsdp/attention.h"
#include "fsdp/language_model.h"

namespace fsdp::models {

/// The model's dimensions and the per-rank batch (the presets: shared/spec/gpt.md).
struct GPTConfig {
  int64_t vocab = 256;  ///< token ids 0 ... vocab - 1
  int64_t context = 32;  ///< T: tokens per sequence (learned positions)
  int64_t layers = 2;  ///< transformer blocks
  int64_t heads = 4;  ///< attention heads (width must be a multiple)
  int64_t width = 64;  ///< the embedding width C
  int64_t batch = 4;  ///< per rank
  /// How attention is computed (fsdp/attention.h): a property of the run, not
  /// of the weights, so describe() leaves it out and checkpoints do not record it.
  AttentionKernel attention = AttentionKernel::kAuto;

  /// "tiny", "small", "medium", "large" (shared/spec/gpt.md's table), "xl"
  /// (1.48 B parameters: vocab 256, context 1024, 48 layers, 25 heads, width
  /// 1600, batch 1) or "3b" (xl's depth at width 2304, 18 heads: 3.06 B
  /// parameters); throws for anything else.
  static GPTConfig preset(const std::string& name);
  /// Throws, naming the dimensions, unless all are positive and width is a multiple of heads.
  void validate() const;
  /// "vocab 256, context 32, layers 2, heads 4, width 64, batch 4".
  std::string describe() const;
  /// The planner's description (run_plan.h): the TransformerShape of these
  /// dimensions, whose units the planner's formula gives.
  ModelDescription plan_description() const;
};

/// Causal multi-head self-attention (GPT-2's names: c_attn, c_proj).
class AttentionImpl : public torch::nn::Module {
 public:
  /// Registers the projections for `config`'s width.
  explicit AttentionImpl(const GPTConfig& config);
  /// [B, T, C] -> [B, T, C], each position attending to itself and the ones
  /// before in its sequence (with `packing`).
  torch::Tensor forward(const torch::Tensor& x, const SequencePacking& packing = SequencePacking());
  /// The query, key and value projection (C -> 3C) and the output projection (C -> C).
  ///@{
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  ///@}

 private:
  int64_t heads_;
  AttentionKernel attention_;
};
/// The module holder of AttentionImpl.
TORCH_MODULE(Attention);

/// The block's 4x MLP with GELU (GPT-2's names: c_fc, c_proj).
class MLPImpl : public torch::nn::Module {
 public:
  /// Registers the layers for `config`'s width.
  explicit MLPImpl(const GPTConfig& config);
  /// [B, T, C] -> [B, T, C].
  torch::Tensor forward(const torch::Tensor& x);
  /// C -> 4C and 4C -> C.
  ///@{
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  ///@}
};
/// The module holder of MLPImpl.
TORCH_MODULE(MLP);

/// One transformer block: the natural FSDP unit.
class BlockImpl : public torch::nn::Module {
 public:
  /// Registers the norms, the attention and the MLP for `config`.
  explicit BlockImpl(const GPTConfig& config);
  /// Pre-norm residual: x + attn(ln_1(x)), then + mlp(ln_2(.)).
  torch::Tensor forward(const torch::Tensor& x, const SequencePacking& packing = SequencePacking());
  /// The norms before the attention and before the MLP.
  ///@{
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  ///@}
  Attention attn{nullptr};  ///< the self-attention
  MLP mlp{nullptr};  ///< the MLP
};
/// The module holder of BlockImpl.
TORCH_MODULE(Block);

/// The model's body under GPT-2's names: embeddings, blocks, final norm
/// (GPTImpl runs it; it has no forward of its own).
class TransformerImpl : public torch::nn::Module {
 public:
  /// Registers the embeddings, `config.layers` blocks and the final norm.
  explicit TransformerImpl(const GPTConfig& config);
  /// The token embedding (vocab x C; the lm head's weight too) and the position embedding (context x C).
  ///@{
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  ///@}
  torch::nn::ModuleList h{nullptr};  ///< the blocks (Block), in order
  torch::nn::LayerNorm ln_f{nullptr};  ///< the final norm
};
/// The module holder of TransformerImpl.
TORCH_MODULE(Transformer);

/// The whole model: transformer and the tied lm head.
class GPTImpl : public LanguageModel {
 public:
  /// Validates `config` and registers the modules (initialize with init_weights()).
  explicit GPTImpl(const GPTConfig& config);
  /// Mean cross-entropy of next-token prediction; idx and targets are [B, T] int64.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) override;
  /// Over packed rows (the position embedding read at each token's position
  /// in its sequence), normalised by `loss_divisor` (LanguageModel::forward).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets, const SequencePacking& packing,
                        double loss_divisor) override;
  /// The next-token logits of [B, T] int64 idx: [B, T, vocab].
  torch::Tensor logits(const torch::Tensor& idx) override;
  /// The spec's initialization of one parameter (LanguageModel::init_parameter):
  /// N(0, 0.02), the residual projections (c_proj) N(0, 0.02 / sqrt(2 layers)),
  /// norms' gains one, biases zero.
  void init_parameter(const std::string& name, torch::Tensor& param) const override;
  /// The dimensions it was built with.
  const GPTConfig& config() const { return config_; }
  int64_t vocab() const override { return config_.vocab; }  ///< config().vocab
  int64_t context() const override { return config_.context; }  ///< config().context
  ModelKind kind() const override { return ModelKind::kGpt; }  ///< ModelKind::kGpt
  std::string describe() const override { return config_.describe(); }  ///< config().describe()
  /// config().plan_description()
  ModelDescription plan_description() const override { return config_.plan_description(); }

  Transformer transformer{nullptr};  ///< embeddings, blocks and the final norm
  TiedLMHead lm_head{nullptr};  ///< its weight IS transformer.wte.weight

 private:
  /// The final norm's output [B, T, C]: what the head turns into logits.
  torch::Tensor final_hidden(const torch::Tensor& idx, const SequencePacking& packing = SequencePacking());
  GPTConfig config_;
};
/// The module holder of GPTImpl: what fully_shard() takes.
TORCH_MODULE(GPT);

}  // namespace fsdp::models
