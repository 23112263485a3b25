// NF4 quantization as bitsandbytes 0.50 does it on the CPU (see nf4.h).

#include "core/nf4.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "base/parallel.h"

namespace fsdp::nf4 {
namespace {

// get_4bit_type("nf4"), bit for bit.
constexpr std::array<float, 16> kValues = {
    -0x1.0000000000000p+0f, -0x1.6473620000000p-1f, -0x1.0cd6600000000p-1f, -0x1.9465400000000p-2f,
    -0x1.23449a0000000p-2f, -0x1.7a6a7e0000000p-3f, -0x1.74f0e20000000p-4f, 0x0.0p+0f,
    0x1.45f5fe0000000p-4f, 0x1.4995c60000000p-3f, 0x1.f809ba0000000p-3f, 0x1.5a06740000000p-2f,
    0x1.c349700000000p-2f, 0x1.200f560000000p-1f, 0x1.7227660000000p-1f, 0x1.0000000000000p+0f,
};

// create_dynamic_map(signed=True), bit for bit.
constexpr std::array<float, 256> kDynamicMap = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,
};

// The index of the NF4 value nearest to `scaled` (in [-1, 1]): torch.bucketize
// over the midpoints, which quantize_4bit uses: the count of midpoints
// strictly below it (a tie goes to the lower value).
struct Midpoints {
  std::array<float, 15> m;
  Midpoints() {
    for (size_t i = 0; i < m.size(); ++i) m[i] = (kValues[i] + kValues[i + 1]) / 2.0f;
  }
  uint8_t code(float scaled) const {
    uint8_t c = 0;
    while (c < m.size() && m[c] < scaled) ++c;
    return c;
  }
};

float clamp_unit(float x) { return std::min(1.0f, std::max(-1.0f, x)); }

// Block b of a weight: its 32 packed bytes and its absmax, wherever they
// are kept (two arrays, as bitsandbytes stores a weight, or one record).
struct BlockView {
  const uint8_t* codes;
  float scale;
};

// Every block's elements (`n` in all; the last block may hold fewer) as
// nf4[code] * absmax in fp32, rounded to T: dequantize_4bit's arithmetic.
template <typename T, typename Blocks>
void dequantize_blocks(const Blocks& block_at, int64_t n, T* out) {
  parallel::for_each_chunk(0, blocks(n), 256, at::get_num_threads(), [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const BlockView block = block_at(b);
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      for (int64_t i = begin; i < end; i += 2) {
        const uint8_t byte = block.codes[(i - begin) / 2];
        out[i] = static_cast<T>(kValues[byte >> 4] * block.scale);
        if (i + 1 < end) out[i + 1] = static_cast<T>(kValues[byte & 0x0F] * block.scale);
      }
    }
  });
}

// fn(out's data as float, BFloat16 or Half); `who` names the caller in the refusal of another dtype.
template <typename Fn>
void with_output(const torch::Tensor& out, const char* who, const Fn& fn) {
  switch (out.scalar_type()) {
    case torch::kFloat: return fn(out.data_ptr<float>());
    case torch::kBFloat16: return fn(out.data_ptr<c10::BFloat16>());
    case torch::kHalf: return fn(out.data_ptr<c10::Half>());
    default: TORCH_CHECK(false, who, ": the output must be float32, bfloat16 or float16, got ", out.scalar_type());
  }
}

}  // namespace

torch::Tensor code_values(c10::Device device) {
  return torch::tensor(std::vector<float>(kValues.begin(), kValues.end()), torch::kFloat).to(device);
}

torch::Tensor dynamic_map() { return torch::tensor(std::vector<float>(kDynamicMap.begin(), kDynamicMap.end()), torch::kFloat); }

Quantized quantize(const torch::Tensor& values) {
  TORCH_CHECK(values.device().is_cpu() && values.is_floating_point(),
              "nf4::quantize: expected a floating tensor on the CPU, got ", values.scalar_type(), " on ", values.device());
  const torch::Tensor flat = values.detach().reshape({-1}).to(torch::kFloat).contiguous();
  const int64_t n = flat.numel();
  Quantized q{torch::empty({(n + 1) / 2}, torch::kByte), torch::empty({blocks(n)}, torch::kFloat)};
  const float* x = flat.data_ptr<float>();
  uint8_t* packed = q.packed.data_ptr<uint8_t>();
  float* absmax = q.absmax.data_ptr<float>();
  static const Midpoints midpoints;
  parallel::for_each_chunk(0, blocks(n), 1024, at::get_num_threads(), [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      float largest = 0.0f;
      for (int64_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(x[i]));
      absmax[b] = largest;
      const float guarded = std::max(largest, 1e-38f);
      // Whole blocks multiply by the reciprocal, the partial last one
      // divides: quantize_4bit's two code paths, whose roundings differ.
      const bool whole = end - begin == kBlock;
      const float reciprocal = 1.0f / guarded;
      for (int64_t i = begin; i < end; i += 2) {
        auto code = [&](int64_t j) -> uint8_t {
          if (j >= end) return kZeroCode;
          return midpoints.code(clamp_unit(whole ? x[j] * reciprocal : x[j] / guarded));
        };
        packed[i / 2] = static_cast<uint8_t>(code(i) << 4 | code(i + 1));
      }
    }
  });
  return q;
}

void dequantize_into(const torch::Tensor& packed, const torch::Tensor& absmax, int64_t n, torch::Tensor& out) {
  TORCH_CHECK(packed.scalar_type() == torch::kByte && packed.numel() >= (n + 1) / 2 && packed.is_contiguous(),
              "nf4::dequantize: expected at least ", (n + 1) / 2, " contiguous packed bytes, got ", packed.numel(), " ",
              packed.scalar_type());
  TORCH_CHECK(absmax.scalar_type() == torch::kFloat && absmax.numel() >= blocks(n) && absmax.is_contiguous(),
              "nf4::dequantize: expected at least ", blocks(n), " contiguous float32 absmax, got ", absmax.numel(), " ",
              absmax.scalar_type());
  TORCH_CHECK(out.numel() == n && out.is_contiguous() && out.device() == packed.device() &&
                  absmax.device() == packed.device(),
              "nf4::dequantize: expected a contiguous output of ", n, " elements on ", packed.device(), ", got ",
              out.numel(), " on ", out.device());
  if (n == 0) return;
  if (packed.device().is_cpu()) {
    const uint8_t* codes = packed.data_ptr<uint8_t>();
    const float* scales = absmax.data_ptr<float>();
    auto block_at = [&](int64_t b) { return BlockView{codes + b * kBlockBytes, scales[b]}; };
    return with_output(out, "nf4::dequantize", [&](auto* o) { dequantize_blocks(block_at, n, o); });
  }
  // Elsewhere (a GPU): the same arithmetic in ATen ops.
  torch::NoGradGuard no_grad;
  const torch::Tensor bytes = packed.narrow(0, 0, (n + 1) / 2);
  const torch::Tensor codes = torch::stack({bytes.bitwise_right_shift(4), bytes.bitwise_and(0x0F)}, 1).reshape({-1}).narrow(0, 0, n);
  const torch::Tensor scales = absmax.narrow(0, 0, blocks(n)).repeat_interleave(kBlock).narrow(0, 0, n);
  out.copy_(code_values(packed.device()).index_select(0, codes.to(torch::kLong)).mul_(scales));
}

torch::Tensor dequantize(const torch::Tensor& packed, const torch::Tensor& absmax, int64_t n, torch::ScalarType dtype) {
  torch::Tensor out = torch::empty({n}, packed.options().dtype(dtype));
  dequantize_into(packed, absmax, n, out);
  return out;
}

void write_records(const Quantized& q, int64_t n, torch::Tensor records) {
  const int64_t count = blocks(n);
  TORCH_CHECK(records.device().is_cpu() && records.scalar_type() == torch::kByte && records.is_contiguous() &&
                  records.numel() >= count * kRecordBytes,
              "nf4::write_records: expected ", count * kRecordBytes, " contiguous bytes on the CPU, got ", records.numel(),
              " ", records.scalar_type(), " on ", records.device());
  TORCH_CHECK(q.packed.numel() == (n + 1) / 2 && q.absmax.numel() == count,
              "nf4::write_records: expected ", (n + 1) / 2, " packed bytes and ", count, " absmax for ", n,
              " elements, got ", q.packed.numel(), " and ", q.absmax.numel());
  const torch::Tensor packed = q.packed.contiguous(), absmax = q.absmax.to(torch::kFloat).contiguous();
  const uint8_t* codes = packed.data_ptr<uint8_t>();
  const float* scales = absmax.data_ptr<float>();
  uint8_t* out = records.data_ptr<uint8_t>();
  const int64_t bytes = packed.numel();
  for (int64_t b = 0; b < count; ++b) {
    uint8_t* record = out + b * kRecordBytes;
    const int64_t first = b * kBlockBytes, have = std::min(kBlockBytes, bytes - first);
    std::memcpy(record, codes + first, have);
    std::memset(record + have, kZeroCode << 4 | kZeroCode, kBlockBytes - have);
    std::memcpy(record + kBlockBytes, scales + b, sizeof(float));
  }
}

void quantize_into_records(const torch::Tensor& values, torch::Tensor records) {
  write_records(quantize(values), values.numel(), std::move(records));
}

void clear_records(torch::Tensor records) {
  TORCH_CHECK(records.scalar_type() == torch::kByte && records.numel() % kRecordBytes == 0,
              "nf4::clear_records: expected whole ", kRecordBytes, "-byte records, got ", records.numel(), " ",
              records.scalar_type());
  const torch::Tensor table = records.view({-1, kRecordBytes});
  table.narrow(1, 0, kBlockBytes).fill_(kZeroCode << 4 | kZeroCode);
  table.narrow(1, kBlockBytes, 4).zero_();
}

void dequantize_records_into(const torch::Tensor& records, torch::Tensor& out) {
  TORCH_CHECK(records.scalar_type() == torch::kByte && records.is_contiguous() && records.numel() % kRecordBytes == 0,
              "nf4::dequantize_records_into: expected whole ", kRecordBytes, "-byte records, got ", records.numel(),
              " ", records.scalar_type());
  const int64_t count = records.numel() / kRecordBytes;
  TORCH_CHECK(out.numel() == count * kBlock && out.is_contiguous() && out.device() == records.device(),
              "nf4::dequantize_records_into: expected a contiguous output of ", count * kBlock, " elements on ",
              records.device(), ", got ", out.numel(), " on ", out.device());
  if (count == 0) return;
  if (!records.device().is_cpu()) {  // a GPU: split the records, then dequantize_into's ATen path
    const torch::Tensor table = records.view({count, kRecordBytes});
    const torch::Tensor packed = table.narrow(1, 0, kBlockBytes).contiguous().view({-1});
    const torch::Tensor absmax = table.narrow(1, kBlockBytes, 4).contiguous().view(torch::kFloat).view({-1});
    dequantize_into(packed, absmax, count * kBlock, out);
    return;
  }
  const uint8_t* in = records.data_ptr<uint8_t>();
  auto block_at = [&](int64_t b) {
    const uint8_t* record = in + b * kRecordBytes;
    float scale;
    std::memcpy(&scale, record + kBlockBytes, sizeof(float));  // unaligned
    return BlockView{record, scale};
  };
  with_output(out, "nf4::dequantize_records_into", [&](auto* o) { dequantize_blocks(block_at, count * kBlock, o); });
}

namespace {

// bitsandbytes' CPU quantize_blockwise finds a code through a table of 65536
// bins over [-1, 1], each holding the code whose midpoints enclose the
// bin's left value: build_quantize_lut and norm_to_lut_index, with their
// float arithmetic.
constexpr int kBins = 65536;

std::vector<uint8_t> nested_bins() {
  std::array<float, 255> midpoints;
  for (size_t i = 0; i < midpoints.size(); ++i) midpoints[i] = 0.5f * (kDynamicMap[i] + kDynamicMap[i + 1]);
  std::vector<uint8_t> bins(kBins);
  size_t code = 0;
  for (int i = 0; i < kBins; ++i) {
    const float value = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kBins - 1);
    while (code < midpoints.size() && midpoints[code] < value) ++code;
    bins[i] = static_cast<uint8_t>(code);
  }
  return bins;
}

uint16_t bin_of(float scaled) {
  scaled = clamp_unit(scaled);
  return static_cast<uint16_t>((scaled + 1.0f) * 0.5f * static_cast<float>(kBins - 1) + 0.5f);
}

}  // namespace

NestedAbsmax nest_absmax(const torch::Tensor& absmax) {
  TORCH_CHECK(absmax.device().is_cpu() && absmax.scalar_type() == torch::kFloat && absmax.dim() == 1,
              "nf4::nest_absmax: expected a 1-D float32 tensor on the CPU, got ", absmax.sizes(), " ",
              absmax.scalar_type(), " on ", absmax.device());
  static const std::vector<uint8_t> bins = nested_bins();
  NestedAbsmax nested;
  nested.offset = absmax.mean();
  const torch::Tensor centred = (absmax - nested.offset).contiguous();
  const int64_t m = centred.numel(), groups = (m + kNestedBlock - 1) / kNestedBlock;
  nested.codes = torch::empty({m}, torch::kByte);
  nested.absmax = torch::empty({groups}, torch::kFloat);
  nested.quant_map = dynamic_map();
  const float* v = centred.data_ptr<float>();
  uint8_t* codes = nested.codes.data_ptr<uint8_t>();
  float* scales = nested.absmax.data_ptr<float>();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kNestedBlock, end = std::min(m, begin + kNestedBlock);
    float largest = 0.0f;
    for (int64_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(v[i]));
    scales[g] = largest;
    const float reciprocal = largest == 0.0f ? 0.0f : 1.0f / largest;
    for (int64_t i = begin; i < end; ++i) codes[i] = largest == 0.0f ? 0 : bins[bin_of(v[i] * reciprocal)];
  }
  return nested;
}

torch::Tensor expand_absmax(const NestedAbsmax& nested) {
  const int64_t m = nested.codes.numel();
  TORCH_CHECK(nested.quant_map.numel() == 256 && nested.absmax.numel() == (m + kNestedBlock - 1) / kNestedBlock &&
                  nested.offset.numel() == 1,
              "nf4::expand_absmax: expected a 256-value map, ", (m + kNestedBlock - 1) / kNestedBlock,
              " nested scales and one offset for ", m, " absmax; got ", nested.quant_map.numel(), ", ",
              nested.absmax.numel(), " and ", nested.offset.numel());
  const torch::Tensor map = nested.quant_map.to(torch::kFloat).contiguous();
  const torch::Tensor scales = nested.absmax.to(torch::kFloat).repeat_interleave(kNestedBlock).narrow(0, 0, m);
  // dequantize_blockwise (code * scale in fp32), then `absmax += offset`.
  return map.index_select(0, nested.codes.to(torch::kLong)).mul_(scales).add_(nested.offset.to(torch::kFloat));
}

}  // namespace fsdp::nf4
