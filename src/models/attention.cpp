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
                                    bool softmax_in_float, const SequencePacking& packing) {
  const int64_t T = q.size(-2), d = q.size(-1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  torch::Tensor hidden = packing.packed() ? packing.allowed.logical_not()
                                          : torch::ones({T, T}, q.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
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

SequencePacking SequencePacking::from_positions(const torch::Tensor& positions) {
  TORCH_CHECK(positions.dim() == 2 && positions.scalar_type() == torch::kLong,
              "SequencePacking: expected positions [B, T] int64, got ", positions.sizes(), " ",
              positions.scalar_type());
  const torch::Tensor host = positions.to(torch::kCPU).contiguous();
  const int64_t B = host.size(0), T = host.size(1);
  const int64_t* p = host.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t expected = t == 0 ? 0 : p[b * T + t - 1] + 1;
      TORCH_CHECK(p[b * T + t] == expected || p[b * T + t] == 0, "SequencePacking: position ", p[b * T + t],
                  " at row ", b, ", column ", t, ": expected 0 (a sequence starts) or ", expected);
    }
  }
  // Sequence number of each token: how many starts came up to it.
  const torch::Tensor sequence = positions.eq(0).cumsum(1);
  const torch::Tensor same = sequence.unsqueeze(2).eq(sequence.unsqueeze(1));
  const torch::Tensor causal = torch::ones({T, T}, positions.options().dtype(torch::kBool)).tril();
  return SequencePacking{positions, same.logical_and(causal).unsqueeze(1)};
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               AttentionKernel kernel, bool softmax_in_float, const SequencePacking& packing) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "causal_attention: expected q [B, H, T, d] and k, v [B, Hkv, T, d] with H a multiple of Hkv, got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const int64_t groups = q.size(1) / k.size(1);
  if (resolve_attention(kernel) == AttentionKernel::kWrittenOut) {
    return written_out_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), softmax_in_float, packing);
  }
#if FSDP_HAS_SDPA
  if (packing.packed()) {
    TORCH_CHECK(packing.allowed.size(0) == q.size(0) && packing.allowed.size(-1) == q.size(2),
                "causal_attention: the packing's mask is ", packing.allowed.sizes(), " for queries ", q.sizes());
#if FSDP_SDPA_HAS_GQA
    // On a GPU the kernel that takes a mask (memory-efficient) does not read
    // grouped heads in place: repeat them, or the math kernel keeps B H T^2.
    if (!q.is_cuda()) {
      return at::scaled_dot_product_attention(q, k, v, packing.allowed, 0.0, /*is_causal=*/false, {}, groups > 1);
    }
    return at::scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), packing.allowed, 0.0,
                                            /*is_causal=*/false);
#else
    return at::scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), packing.allowed, 0.0,
                                            /*is_causal=*/false);
#endif
  }
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
