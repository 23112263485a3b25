#pragma once
// The safetensors header, parsed and validated without LibTorch, so that
// the fuzz target (tests/fuzz) links nothing heavier than c10's error type.
// Every problem throws a c10::Error naming the file and, where there is
// one, the tensor.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::safetensors {

// Headers larger than this are refused rather than allocated (the format's
// reference implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct HeaderEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  uint64_t element_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
};

struct Header {
  uint64_t data_start = 0;  // 8 + the header's length
  std::vector<HeaderEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Bytes per element of a dtype code; 0 for a code the format does not have.
uint64_t element_size(const std::string& dtype);

// The header length in a file's first 8 bytes (little endian), checked to
// fit a file of file_size bytes and the size bound.
uint64_t header_length(const unsigned char first_8_bytes[8], uint64_t file_size, const std::string& path);

// The header's JSON text, validated against a file of file_size bytes:
// known dtypes, sane shapes, offsets inside the data section, sizes that
// match shape x dtype, and tensors that tile the data section exactly.
Header parse_header(const std::string& json_text, uint64_t file_size, const std::string& path);

}  // namespace fsdp::safetensors
