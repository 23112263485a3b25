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

/// Causal attention of q [B, H, T, d] over k and v [B, Hkv, T, d], H a
/// multiple of Hkv (grouped-query heads: query head h reads key-value head
/// h / (H / Hkv), transformers' repeat_kv), scaled by 1 / sqrt(d): [B, H, T, d].
/// The fused kernels accumulate the softmax in fp32 inside; the written-out
/// path computes it in fp32 and casts back with `softmax_in_float` (the
/// Llama's, as transformers' eager attention), else in the inputs' dtype (the
/// reference GPT's, shared/spec/gpt.md), so that its numbers stay as they were.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               AttentionKernel kernel, bool softmax_in_float);

}  // namespace fsdp
