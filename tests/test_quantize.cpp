// The int8 block packing behind ZeRO++'s quantized collectives
// (src/comm/quantize.h): the error bound of one round trip against each
// block's range, determinism, the layout's sizes, and the fp32 sum.

#include <gtest/gtest.h>

#include "comm/quantize.h"

#include <torch/torch.h>

namespace q = fsdp::quantize;

namespace {
torch::Tensor round_trip(const torch::Tensor& x, int64_t block) {
  torch::Tensor packed = torch::empty({q::packed_bytes(x.numel(), block)}, torch::kByte);
  q::pack(x, block, packed);
  torch::Tensor out = torch::empty({x.numel()}, torch::kFloat);
  q::unpack_into(packed, 1, x.numel(), block, out);
  return out;
}
}  // namespace

// |x - dequantize(quantize(x))| <= max|x| over x's block / 254 (half a
// step of 127 levels), for values of very different ranges in one tensor,
// sizes that are and are not whole blocks, and several block sizes.
TEST(Quantize, OneRoundTripIsWithinHalfAStepOfEachBlocksRange) {
  torch::manual_seed(0);
  for (int64_t block : {4, 64, 256, 1024}) {
    for (int64_t n : {1, 255, 256, 1000, 4099}) {
      SCOPED_TRACE("block " + std::to_string(block) + ", n " + std::to_string(n));
      // Ranges from 1e-6 to 1e3 along the tensor: a per-tensor scale would
      // flatten the small ones to zero.
      torch::Tensor x = torch::randn({n}) * torch::logspace(-6, 3, n);
      torch::Tensor error = (round_trip(x, block) - x).abs();
      const int64_t nb = (n + block - 1) / block;
      torch::Tensor padded = torch::constant_pad_nd(x, {0, nb * block - n}).view({nb, block});
      torch::Tensor bound = padded.abs().amax(1, true).div(254.0).expand({nb, block}).reshape({-1}).narrow(0, 0, n);
      // float32 on top: x / scale is rounded before it is rounded to a
      // level, so a value within 127 ulps of a half-level may take the
      // farther level (2e-5 of the bound), and the scale and the product
      // round too (the small preset's gathers went over by more than 1e-5).
      EXPECT_TRUE((error <= bound * (1 + 1e-4) + 1e-30).all().item<bool>())
          << "worst excess " << (error - bound).max().item<double>();
      // And the bound is not vacuous: some error is near it.
      if (n >= block) EXPECT_GT((error / bound.clamp_min(1e-30)).max().item<double>(), 0.5);
    }
  }
}

TEST(Quantize, ZerosAndTheBlocksLargestValueAreExact) {
  torch::Tensor x = torch::zeros({512});
  x[300] = -3.5;
  torch::Tensor y = round_trip(x, 256);
  EXPECT_TRUE(torch::equal(y.narrow(0, 0, 256), torch::zeros({256})));  // an all-zero block stays zero
  EXPECT_EQ(y[300].item<float>(), -3.5f);                                // +-127 levels: the max is exact
}

TEST(Quantize, TheSameInputAlwaysPacksToTheSameBytes) {
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({3000});
  torch::Tensor a = torch::empty({q::packed_bytes(3000, 256)}, torch::kByte), b = torch::empty_like(a);
  q::pack(x, 256, a);
  q::pack(x.clone(), 256, b);
  EXPECT_TRUE(torch::equal(a, b));
  // bf16 input packs as its fp32 value.
  q::pack(x.to(torch::kBFloat16), 256, a);
  q::pack(x.to(torch::kBFloat16).to(torch::kFloat), 256, b);
  EXPECT_TRUE(torch::equal(a, b));
}

// Whole blocks of int8, then one fp32 scale per block: a quarter of fp32's
// bytes plus 4 / block.
TEST(Quantize, PackedSizeIsWholeBlocksAndOneScaleEach) {
  EXPECT_EQ(q::packed_bytes(0, 256), 0);
  EXPECT_EQ(q::packed_bytes(1, 256), 256 + 4);
  EXPECT_EQ(q::packed_bytes(256, 256), 256 + 4);
  EXPECT_EQ(q::packed_bytes(257, 256), 512 + 8);
  EXPECT_THROW(q::packed_bytes(10, 6), c10::Error);
  torch::Tensor wrong = torch::empty({10}, torch::kByte);
  EXPECT_THROW(q::pack(torch::ones({100}), 64, wrong), c10::Error);
}

// Several packed rows: unpack_into lays them end to end, unpack_sum adds
// them in fp32, in row order.
TEST(Quantize, RowsUnpackEndToEndAndSumInFp32) {
  torch::manual_seed(2);
  const int64_t n = 700, block = 128, row = q::packed_bytes(n, block);
  torch::Tensor rows = torch::randn({3, n});
  torch::Tensor packed = torch::empty({3 * row}, torch::kByte);
  for (int64_t i = 0; i < 3; ++i) {
    torch::Tensor out = packed.narrow(0, i * row, row);
    q::pack(rows[i], block, out);
  }
  torch::Tensor all = torch::empty({3 * n});
  q::unpack_into(packed, 3, n, block, all);
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(all.narrow(0, i * n, n), round_trip(rows[i], block)));
  torch::Tensor sum = q::unpack_sum(packed, 3, n, block);
  torch::Tensor expected = all.narrow(0, 0, n) + all.narrow(0, n, n) + all.narrow(0, 2 * n, n);
  EXPECT_TRUE(torch::equal(sum, expected));
}
