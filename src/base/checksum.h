#pragma once
// File checksums: what files are written with, and a streaming hash over
// their bytes (the algorithms: fsdp/checksum.h).

#include <cstddef>
#include <cstdint>
#include <string>

#include "fsdp/checksum.h"

struct XXH3_state_s;  // xxhash.h's, kept out of the headers

namespace fsdp::checksum {

/// What every file written now carries.
constexpr Algorithm kWritten = Algorithm::kXxh3_64;
/// What a file that names no algorithm carries (written before they were named).
constexpr Algorithm kUnnamed = Algorithm::kFnv1a64;

/// The algorithm a file names (a file that names none: kUnnamed). Throws
/// naming the file, the name found and the names this version knows.
Algorithm parse_algorithm(const std::string& name, const std::string& file);

/// A 64-bit hash fed in pieces: the digest is the same however the bytes are
/// split between update() calls.
class Hasher {
 public:
  /// A hash of no bytes yet, with `algorithm`.
  explicit Hasher(Algorithm algorithm);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  /// The algorithm it hashes with.
  Algorithm algorithm() const { return algorithm_; }
  /// Hashes `bytes` more bytes from `data`.
  void update(const void* data, size_t bytes);
  /// The hash of every byte so far (more may follow).
  uint64_t digest() const;

 private:
  Algorithm algorithm_;
  uint64_t fnv_ = 0;
  XXH3_state_s* xxh3_ = nullptr;
};

/// One buffer's hash.
uint64_t hash(Algorithm algorithm, const void* data, size_t bytes);

}  // namespace fsdp::checksum
