#pragma once
// Block-wise int8 quantization of collective payloads (ZeRO++'s qwZ and
// qgZ). The engine's own; not installed.
//
// A payload of n elements is packed as one byte buffer:
//   [ nb * B int8 values ][ nb fp32 scales ],  nb = ceil(n / B), B = the block size;
// the values are padded with zeros to whole blocks, so that a block never
// spans two ranks' payloads and the buffers of every rank have the same size
// (what all-gather and all-to-all need). Block b's scale is its largest
// magnitude / 127; a value is round(x / scale), so it is off by at most
// scale / 2 = max|x| / 254 after dequantization. Rounding is half-to-even
// on every device: the same input always packs to the same bytes.
//
// Device-generic ATen ops: the same code runs on the CPU and on a GPU.

#include <torch/types.h>

#include <cstdint>

namespace fsdp::quantize {

// Bytes of the packed form of n elements in blocks of `block`.
int64_t packed_bytes(int64_t n, int64_t block);

// Packs `values` (1-D, any floating dtype; converted to fp32 for the math)
// into `packed` (uint8, packed_bytes(values.numel(), block) bytes, on the
// same device).
void pack(const torch::Tensor& values, int64_t block, torch::Tensor& packed);

// The inverse for `rows` packed payloads of n elements each, laid end to end
// in `packed` (rows * packed_bytes(n, block) bytes): writes them, dequantized
// and cast to out's dtype, into `out`, a contiguous [rows * n] tensor.
void unpack_into(const torch::Tensor& packed, int64_t rows, int64_t n, int64_t block, torch::Tensor& out);

// As unpack_into, but returns the rows' element-wise sum in fp32 ([n]),
// accumulated in row order (deterministic).
torch::Tensor unpack_sum(const torch::Tensor& packed, int64_t rows, int64_t n, int64_t block);

}  // namespace fsdp::quantize
