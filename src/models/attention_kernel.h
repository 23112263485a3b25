#pragma once
// Which attention kernel runs (AttentionKernel, fsdp/attention.h): the one
// this LibTorch has for an ask, and the line the tools print of it.

#include "fsdp/attention.h"

namespace fsdp {

/// Whether this LibTorch has scaled_dot_product_attention (2.0 and later).
bool fused_attention_available();

/// kAuto resolved for this LibTorch (kFused or kWrittenOut); kFused on a
/// LibTorch without the kernel throws, naming the version.
AttentionKernel resolve_attention(AttentionKernel kernel);

/// What the run computes, for its banner: for the fused path the kernel
/// LibTorch picks for queries of `options` with `heads` heads (and
/// `kv_heads` key-value heads) of `head_dim` ("flash", "efficient", "cudnn",
/// "math", ...), e.g. "scaled_dot_product_attention (flash, LibTorch's
/// choice for float on cpu)"; else "written out (...)" and why.
std::string describe_attention(AttentionKernel kernel, const torch::TensorOptions& options, int64_t heads,
                               int64_t kv_heads, int64_t head_dim);

}  // namespace fsdp
