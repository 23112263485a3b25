// Causal self-attention, fused or written out (fsdp/attention.h). The one
// place both model families compute it, and the one place that knows which
// LibTorch has the fused kernel.
#include "fsdp/attention.h"

#include <cmath>
#include <limits>

#include "../base/compat.h"
#include "models/attention_kernel.h"

#if FSDP_TORCH_AT_LEAST(2, 0)
#include <ATen/SDPBackend.h>
#define FSDP_HAS_SDPA 1
#else
#define FSDP_HAS_SDPA 0
#endif
// scaled_dot_product_attention's enable_gqa (2.5): key-value heads read in
// place, where before they had to be repeated to the query heads' count.
#define FSDP_SDPA_HAS_GQA FSDP_TORCH_AT_LEAST(2, 5)

namespace fsdp {

namespace {

std::string libtorch_version() {
  return c10::str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

// transformers' repeat_kv: [B, Hkv, T, d] -> [B, H, T, d], key-value head j
// serving query heads j * groups ... (j + 1) * groups - 1.
torch::Tensor repeat_kv(const torch::Tensor& t, int64_t groups) {
  return groups == 1 ? t : t.repeat_interleave(groups, /*dim=*/1);
}

torch::Tensor written_out_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    bool softmax_in_float) {
  const int64_t T = q.size(-2), d = q.size(-1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  torch::Tensor future = torch::ones({T, T}, q.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor probs =
      softmax_in_float ? torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type()) : torch::softmax(scores, -1);
  return torch::matmul(probs, v);
}

#if FSDP_HAS_SDPA
const char* backend_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math: return "math, which keeps the B H T^2 probabilities";
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "memory-efficient";
    default: break;
  }
  // cuDNN's (2.2), and kernels a later LibTorch adds, by the number it gives.
  return choice == 3 ? "cudnn" : "overrideable";
}
#endif

}  // namespace

bool fused_attention_available() { return FSDP_HAS_SDPA; }

AttentionKernel resolve_attention(AttentionKernel kernel) {
  if (kernel == AttentionKernel::kAuto) {
    return fused_attention_available() ? AttentionKernel::kFused : AttentionKernel::kWrittenOut;
  }
  TORCH_CHECK(kernel != AttentionKernel::kFused || fused_attention_available(),
              "fused attention (scaled_dot_product_attention) needs LibTorch 2.0 or later; this one is ",
              libtorch_version(), ": use the written-out attention");
  return kernel;
}

namespace detail {

const EnumNames& enum_names(EnumTag<AttentionKernel>) {
  static const EnumNames names = EnumNames::of<AttentionKernel>("attention", {
      {AttentionKernel::kAuto, "auto"},
      {AttentionKernel::kFused, "sdpa"},
      {AttentionKernel::kWrittenOut, "written"}});
  return names;
}

}  // namespace detail

std::string describe_attention(AttentionKernel kernel, const torch::TensorOptions& options, int64_t heads,
                               int64_t kv_heads, int64_t head_dim) {
  if (resolve_attention(kernel) == AttentionKernel::kWrittenOut) {
    return kernel == AttentionKernel::kAuto
               ? "written out (LibTorch " + libtorch_version() + " has no scaled_dot_product_attention)"
               : std::string("written out (as asked)");
  }
#if FSDP_HAS_SDPA
  // What LibTorch's own dispatcher picks for the run's queries (one
  // position is enough: the choice depends on dtypes, head sizes, the device
  // and its flags, not on the length).
  const auto dtype = options.dtype().toScalarType();
  const torch::Tensor q = torch::zeros({1, heads, 1, head_dim}, options);
  const torch::Tensor kv = torch::zeros({1, FSDP_SDPA_HAS_GQA ? kv_heads : heads, 1, head_dim}, options);
#if FSDP_SDPA_HAS_GQA
  const int64_t choice = at::_fused_sdp_choice(q, kv, kv, {}, 0.0, /*is_causal=*/true, {}, kv_heads != heads);
#else
  const int64_t choice = at::_fused_sdp_choice(q, kv, kv, {}, 0.0, /*is_causal=*/true);
#endif
  return c10::str("scaled_dot_product_attention (", backend_name(choice), ", LibTorch ", libtorch_version(),
                  "'s choice for ", c10::toString(dtype), " on ", options.device().str(), ")");
#else
  TORCH_CHECK(false, "describe_attention: unreachable without scaled_dot_product_attention");
#endif
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               AttentionKernel kernel, bool softmax_in_float) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "causal_attention: expected q [B, H, T, d] and k, v [B, Hkv, T, d] with H a multiple of Hkv, got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const int64_t groups = q.size(1) / k.size(1);
  if (resolve_attention(kernel) == AttentionKernel::kWrittenOut) {
    return written_out_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), softmax_in_float);
  }
#if FSDP_HAS_SDPA
#if FSDP_SDPA_HAS_GQA
  // As transformers' sdpa attention without a mask: the grouped heads in place.
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, {}, /*enable_gqa=*/groups > 1);
#else
  return at::scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), {}, 0.0, /*is_causal=*/true);
#endif
#else
  TORCH_CHECK(false, "causal_attention: unreachable without scaled_dot_product_attention");
#endif
}

}  // namespace fsdp
