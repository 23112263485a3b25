// Block-wise int8 packing of collective payloads: see quantize.h.
#include "comm/quantize.h"

#include <torch/torch.h>

namespace fsdp::quantize {
namespace {

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The int8 values and the fp32 scales of `rows` payloads, as views into `packed`.
struct PackedViews {
  torch::Tensor values;  // int8 [rows, nb, block]
  torch::Tensor scales;  // fp32 [rows, nb, 1]
};

PackedViews views(const torch::Tensor& packed, int64_t rows, int64_t n, int64_t block) {
  const int64_t nb = blocks(n, block), row_bytes = packed_bytes(n, block);
  TORCH_CHECK(packed.scalar_type() == torch::kByte && packed.is_contiguous() && packed.numel() == rows * row_bytes,
              "quantize: expected a contiguous uint8 buffer of ", rows, " x ", row_bytes, " bytes (", n,
              " elements in blocks of ", block, "), found ", packed.scalar_type(), " of ", packed.numel());
  torch::Tensor by_row = packed.view({rows, row_bytes});
  PackedViews v;
  v.values = by_row.narrow(1, 0, nb * block).view(torch::kChar).view({rows, nb, block});
  // The scales start at a multiple of 4 bytes in every row (nb * block is
  // a multiple of the block, itself checked to be one of 4).
  v.scales = by_row.narrow(1, nb * block, 4 * nb).contiguous().view(torch::kFloat).view({rows, nb, 1});
  return v;
}

}  // namespace

int64_t packed_bytes(int64_t n, int64_t block) {
  TORCH_CHECK(block > 0 && block % 4 == 0, "quantization block must be a positive multiple of 4 elements, got ",
              block);
  const int64_t nb = blocks(n, block);
  return nb * block + 4 * nb;
}

void pack(const torch::Tensor& values, int64_t block, torch::Tensor& packed) {
  const int64_t n = values.numel(), nb = blocks(n, block), row_bytes = packed_bytes(n, block);
  TORCH_CHECK(packed.scalar_type() == torch::kByte && packed.is_contiguous() && packed.numel() == row_bytes,
              "quantize::pack: expected a contiguous uint8 buffer of ", row_bytes, " bytes, found ",
              packed.scalar_type(), " of ", packed.numel());
  if (n == 0) return;
  torch::NoGradGuard no_grad;
  torch::Tensor x = values.reshape({-1}).to(torch::kFloat);
  if (nb * block != n) x = torch::constant_pad_nd(x, {0, nb * block - n});
  x = x.view({nb, block});
  torch::Tensor scale = x.abs().amax(1, /*keepdim=*/true).div_(127.0f);
  // An all-zero block keeps scale 0 and quantizes to zeros.
  torch::Tensor safe = torch::where(scale > 0, scale, torch::ones_like(scale));
  torch::Tensor q = x.div(safe).round_().clamp_(-127, 127).to(torch::kChar);
  torch::Tensor row = packed.view({1, row_bytes});
  row.narrow(1, 0, nb * block).view(torch::kChar).view({nb, block}).copy_(q);
  row.narrow(1, nb * block, 4 * nb).copy_(scale.reshape({1, nb}).contiguous().view(torch::kByte).view({1, 4 * nb}));
}

void unpack_into(const torch::Tensor& packed, int64_t rows, int64_t n, int64_t block, torch::Tensor& out) {
  TORCH_CHECK(out.is_contiguous() && out.numel() == rows * n, "quantize::unpack_into: expected a contiguous output of ",
              rows, " x ", n, " elements, found ", out.numel());
  if (n == 0) return;
  torch::NoGradGuard no_grad;
  const PackedViews v = views(packed, rows, n, block);
  const int64_t nb = v.values.size(1);
  torch::Tensor full = v.values.to(torch::kFloat).mul_(v.scales).view({rows, nb * block});
  out.view({rows, n}).copy_(full.narrow(1, 0, n));
}

torch::Tensor unpack_sum(const torch::Tensor& packed, int64_t rows, int64_t n, int64_t block) {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({n}, packed.options().dtype(torch::kFloat));
  if (n == 0) return sum;
  const PackedViews v = views(packed, rows, n, block);
  const int64_t nb = v.values.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    sum.add_(v.values[r].to(torch::kFloat).mul_(v.scales[r]).view({nb * block}).narrow(0, 0, n));
  }
  return sum;
}

}  // namespace fsdp::quantize
