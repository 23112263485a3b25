// libFuzzer target: the safetensors header reader must refuse any input
// with a c10::Error, never crash, hang or read out of bounds. The input is
// a whole file: 8-byte length, JSON header, data.

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "state_dict/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const uint64_t length = fsdp::safetensors::header_length(data, size, "<fuzz>");
    std::string json(reinterpret_cast<const char*>(data) + 8, length);
    fsdp::safetensors::Header header = fsdp::safetensors::parse_header(json, size, "<fuzz>");
    // What the reader then trusts: every tensor inside the file.
    for (const auto& t : header.tensors) {
      if (header.data_start + t.end > size) __builtin_trap();
    }
  } catch (const c10::Error&) {
    // A refusal is the expected outcome for malformed input.
  }
  return 0;
}
