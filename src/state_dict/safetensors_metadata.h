#pragma once
// What our safetensors files add to the format: the checksum in the header's
// metadata (fsdp/safetensors.h says how it is computed), and the dtype codes
// written.

#include <cstdint>
#include <string>

#include "fsdp/safetensors.h"

namespace fsdp::safetensors {

/// The header metadata's key of our checksum (16 hex digits).
constexpr const char* kChecksumKey = "fsdp_checksum";
/// The header metadata's key of the checksum's algorithm (fsdp::enum_name of a checksum::Algorithm).
constexpr const char* kChecksumAlgorithmKey = "fsdp_checksum_algorithm";
/// 16 lower-case hex digits, and back (throws on anything else).
///@{
std::string hex64(uint64_t value);
uint64_t parse_hex64(const std::string& text);
///@}
/// The safetensors dtype code ("F32", "BF16", ...) of a scalar type (scalar_type's inverse).
std::string dtype_code(torch::ScalarType type);

}  // namespace fsdp::safetensors
