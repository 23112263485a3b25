#pragma once
/// \file
/// Causal self-attention as both model families compute it: LibTorch's fused
/// scaled_dot_product_attention (2.0 and later: flash attention on CPUs and
/// GPUs, memory-efficient or cuDNN attention where LibTorch picks them), or
/// the written-out product, mask and softmax that LibTorch 1.13 leaves.
///
/// The fused kernels keep, per layer, the output and one log-sum-exp per head
/// and position for backward; the written-out path keeps the B H T^2
/// probabilities (48 MiB per sequence per layer in fp32 at T = 1024 and 12
/// heads). The planner counts whichever the run computes
/// (TransformerShape::attention_saves_probabilities).

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include "fsdp/enum_names.h"

namespace fsdp {

/// Which attention a model computes (GPTConfig::attention, LlamaConfig::attention).
/// Named by enum_name, parsed by parse_enum: "auto", "sdpa", "written" (what the tools'
/// --attention takes and prints).
enum class AttentionKernel {
  kAuto,       ///< fused where this LibTorch has scaled_dot_product_attention, else written out
  kFused,      ///< scaled_dot_product_attention(q, k, v, is_causal = true); refused on a LibTorch without it
  kWrittenOut  ///< q k^T / sqrt(d), the causal mask, softmax, times v (LibTorch 1.13's only path)
};

namespace detail {
const EnumNames& enum_names(EnumTag<AttentionKernel>);  ///< "auto", "sdpa", "written" (what the tools' --attention takes and prints)
}  // namespace detail

/// Several sequences packed into each row of a batch (whole conversations
/// one after another, so that no compute is padding), as transformers reads
/// packed position_ids: a position 0 starts a sequence, which attends to
/// nothing before it and whose positions restart there. Default (undefined
/// tensors): one sequence a row, positions 0 ... T - 1, plain causal attention.
struct SequencePacking {
  /// Reads each row's sequences from `positions` [B, T] int64: every token's
  /// position in its own sequence, 0 where one starts, else one more than the
  /// token before's (a row starts with 0). Throws, naming the row and column,
  /// for anything else.
  static SequencePacking from_positions(const torch::Tensor& positions);
  /// Whether rows hold more than one sequence (the tensors are defined).
  bool packed() const { return positions.defined(); }
  torch::Tensor positions;  ///< [B, T] int64, as given (rotary and learned position embeddings read it)
  /// [B, 1, T, T] bool: query i may read key j (j <= i, in i's sequence): the
  /// block-diagonal causal mask, a byte per pair.
  torch::Tensor allowed;
};

/// Causal attention of q [B, H, T, d] over k and v [B, Hkv, T, d], H a
/// multiple of Hkv (grouped-query heads: query head h reads key-value head
/// h / (H / Hkv), transformers' repeat_kv), scaled by 1 / sqrt(d): [B, H, T, d].
/// The fused kernels accumulate the softmax in fp32 inside; the written-out
/// path computes it in fp32 and casts back with `softmax_in_float` (the
/// Llama's, as transformers' eager attention), else in the inputs' dtype (the
/// reference GPT's, shared/spec/gpt.md), so that its numbers stay as they were.
/// With `packing` packed, each query reads only its own sequence's keys up to
/// itself: scaled_dot_product_attention with packing.allowed as its mask
/// (LibTorch 2.x picks its flash kernel for it on CPUs), or the written-out
/// product with that mask (1.13).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               AttentionKernel kernel, bool softmax_in_float,
                               const SequencePacking& packing = SequencePacking());

}  // namespace fsdp
