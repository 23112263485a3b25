#pragma once
/// \file
/// What a model tells the memory planner of itself before any tensor exists:
/// its transformer shape and the element counts of the units fully_shard
/// makes of it. The model families describe themselves with these
/// (LanguageModel::plan_description); the planner (fsdp::fsdp_plan,
/// run_plan.h) takes them.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "fsdp/wrap_policy.h"

namespace fsdp {

/// A decoder-only transformer as shared/spec/gpt.md builds it (pre-norm
/// blocks, a 4x MLP, materialized attention scores, a tied head), and the
/// per-rank batch.
struct TransformerShape {
  /// The model's dimensions (as GPTConfig's) and the per-rank batch.
  ///@{
  int64_t vocab = 0, context = 0, layers = 0, heads = 0, width = 0, batch = 0;
  ///@}
  /// One unit per attention and one per MLP instead of one per block (the
  /// trainer's `--wrap sublayer`); the norms then belong to the root.
  bool sublayer_units = false;
  /// The activation elements a layer keeps beyond the reference GPT block's,
  /// per token, in the param dtype: 0 for the GPT, 9 C for a Llama decoder
  /// layer of width C, more with its families' switches
  /// (models::LlamaConfig::plan_description says why).
  /// A checkpointed run keeps them for the one layer being recomputed.
  int64_t extra_layer_activations = 0;
  /// The attention is written out (fsdp/attention.h), so that every layer
  /// keeps its B H T^2 probabilities (and the run one T x T mask); else
  /// fused, which keeps one fp32 log-sum-exp per head and position instead.
  bool attention_saves_probabilities = true;
  /// The units fully_shard makes: the root (the embeddings and the final
  /// norm) first, then each block's (or attention's and MLP's).
  std::vector<int64_t> unit_numels() const;
};

/// What a model tells the planner of itself (models::GPTConfig and
/// models::LlamaConfig give theirs, before any tensor exists).
struct ModelDescription {
  /// Its dimensions, the per-rank batch, and the activations a layer keeps
  /// beyond the reference GPT block's (TransformerShape::extra_layer_activations).
  TransformerShape shape;
  /// The element counts of the units fully_shard makes of it, the root first:
  /// one unit per layer, and one per attention and per MLP (the trainer's
  /// `--wrap sublayer`, whose layer norms then belong to the root).
  /// With frozen parameters, each unit's trainable elements only.
  ///@{
  std::vector<int64_t> layer_units, sublayer_units;
  ///@}
  /// Fine-tuning: per unit of each wrap (as layer_units, sublayer_units),
  /// the elements of its frozen part, the parameters that require no
  /// gradient (planned without gradients or optimizer state); empty where
  /// nothing is frozen.
  ///@{
  std::vector<int64_t> layer_frozen, sublayer_frozen;
  ///@}
  /// QLoRA: of each unit's frozen part, the elements of the linear weights
  /// MixedPrecision::frozen_nf4 would hold in NF4 (its default skip list:
  /// all but lm_head), each weight rounded up to whole blocks of 64; empty
  /// where there are none. The planner uses them with frozen_nf4 only.
  ///@{
  std::vector<int64_t> layer_nf4, sublayer_nf4;
  ///@}
  /// The units of one wrap: sublayer_units or layer_units.
  const std::vector<int64_t>& units(bool sublayer) const { return sublayer ? sublayer_units : layer_units; }
  /// Their frozen parts: sublayer_frozen or layer_frozen.
  const std::vector<int64_t>& frozen(bool sublayer) const { return sublayer ? sublayer_frozen : layer_frozen; }
  /// Their NF4 weights: sublayer_nf4 or layer_nf4.
  const std::vector<int64_t>& nf4(bool sublayer) const { return sublayer ? sublayer_nf4 : layer_nf4; }
  /// The parameters' element count, frozen ones included.
  int64_t num_parameters() const;
  /// The elements that train: num_parameters() less the frozen ones.
  int64_t num_trainable() const;
  /// Sets one wrap's units (`sublayer`: sublayer_units and sublayer_frozen,
  /// else the layer ones) to those fully_shard makes of `model` with
  /// `policy` (root first), each split as fully_shard splits it
  /// into its trainable elements and its frozen part's: for a model whose
  /// parameters are partly frozen (requires_grad false), or that has more of
  /// them (LoRA's adapters), than its config describes. `model` may be one
  /// built under memory::DeferredInit: only its shapes are read.
  void describe_units(bool sublayer, torch::nn::Module& model, const WrapPolicy& policy);
};

}  // namespace fsdp
