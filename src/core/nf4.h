#pragma once
// NF4: bitsandbytes' 4-bit NormalFloat storage of frozen weights (QLoRA),
// byte for byte. The engine's own; not installed.
//
// A weight of n elements is cut into blocks of 64. Block b keeps
//   absmax[b]  its largest magnitude (fp32), and
//   64 codes   each element x as the index of the NF4 value nearest to
//              x / absmax[b] (16 values, sorted: 0 is -1, 7 is 0, 15 is 1),
// two codes a byte, the even element in the high nibble. A last block of
// fewer than 64 holds its own absmax; an odd n pads one code 7 (zero).
// Dequantized, element i is nf4_value[code] * absmax[i / 64] in fp32, then
// rounded (to nearest even) to the compute dtype: bitsandbytes'
// dequantize_4bit.
//
// Double quantization (bitsandbytes' compress_statistics, transformers'
// bnb_4bit_use_double_quant) stores the absmax themselves in 8 bits: their
// mean is subtracted, then blocks of 256 keep an fp32 scale and one byte
// each, an index into bitsandbytes' signed dynamic map.
//
// The engine holds the absmax in fp32 (expanded where a folder stored them
// nested): 0.5625 bytes a parameter, against 0.5156 nested, so that a
// gather needs no second dequantization.

#include <torch/types.h>

#include <cstdint>

namespace fsdp::nf4 {

constexpr int64_t kBlock = 64;             // elements per absmax
constexpr int64_t kBlockBytes = kBlock / 2;  // packed bytes per block
constexpr int64_t kNestedBlock = 256;      // absmax per nested scale
constexpr uint8_t kZeroCode = 7;           // the code of 0.0

// Blocks of n elements (the last may be partial).
inline int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// The 16 NF4 values (bitsandbytes' get_4bit_type("nf4")), as a float32 tensor on `device`.
torch::Tensor code_values(c10::Device device = c10::Device(torch::kCPU));
// bitsandbytes' create_dynamic_map(signed=True): the nested absmax' 256 values.
torch::Tensor dynamic_map();

struct Quantized {
  torch::Tensor packed;  // uint8 [ceil(n / 2)]
  torch::Tensor absmax;  // float32 [blocks(n)]
};

// bitsandbytes.functional.quantize_4bit(values, blocksize=64,
// quant_type="nf4") on the CPU: `values` (any floating dtype, any shape,
// read as fp32 in row-major order) on the CPU.
Quantized quantize(const torch::Tensor& values);

// dequantize_4bit: n elements from `packed` and `absmax` (on one device,
// the CPU or a GPU) written, cast to out's dtype, into `out` (contiguous, n
// elements, the same device).
void dequantize_into(const torch::Tensor& packed, const torch::Tensor& absmax, int64_t n, torch::Tensor& out);
torch::Tensor dequantize(const torch::Tensor& packed, const torch::Tensor& absmax, int64_t n,
                         torch::ScalarType dtype);

// How the engine holds NF4 weights: one 36-byte record a block (its 32
// packed bytes, then its absmax as little-endian fp32), so that a unit's
// weights are one byte array that splits on block boundaries into whole
// records: a shard, a gather and a checkpoint's ranges are record ranges.
constexpr int64_t kRecordBytes = kBlockBytes + 4;

// A weight of n elements quantized (`q`, from quantize() or a bitsandbytes
// folder) as blocks(n) records into `records` (uint8 on the CPU, contiguous,
// at least blocks(n) * kRecordBytes bytes); the codes after the nth are zero (7).
void write_records(const Quantized& q, int64_t n, torch::Tensor records);
// quantize() then write_records(): `values` (on the CPU) into blocks(n) records.
void quantize_into_records(const torch::Tensor& values, torch::Tensor records);
// Records of zero: every code 7, absmax 0 (padding).
void clear_records(torch::Tensor records);
// `records` (uint8, whole records, on any device) dequantized into `out`
// (contiguous, 64 elements a record, the same device, float32, bfloat16 or float16).
void dequantize_records_into(const torch::Tensor& records, torch::Tensor& out);

struct NestedAbsmax {
  torch::Tensor codes;   // uint8 [m]: indices into quant_map
  torch::Tensor absmax;  // float32 [ceil(m / 256)]
  torch::Tensor offset;  // float32 scalar: the mean subtracted
  torch::Tensor quant_map;  // float32 [256]
};

// quantize_4bit's compress_statistics=True step, on the CPU: the absmax as
// bitsandbytes nests them.
NestedAbsmax nest_absmax(const torch::Tensor& absmax);
// The inverse, as dequantize_4bit expands them before use.
torch::Tensor expand_absmax(const NestedAbsmax& nested);

}  // namespace fsdp::nf4
