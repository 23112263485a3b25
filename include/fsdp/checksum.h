#pragma once
/// \file
/// File checksums: the algorithms a file of ours may name, and a streaming
/// hash over its bytes.
///
/// Every file we write names its algorithm next to its checksum (safetensors:
/// the header metadata's kChecksumAlgorithmKey; metadata.json:
/// "checksum_algorithm"). New files get XXH3-64 (xxHash), which hashes at tens
/// of GB/s. Files written before algorithms were named carry FNV-1a 64, byte
/// at a time (under 1 GB/s): a file that names no algorithm is read as that,
/// so old checkpoints stay readable and verifiable. FNV-1a is kept for
/// reading only: nothing writes it any more. (Ours starts from the offset
/// 1469598103934665603, not FNV's published one: old files carry that.)

#include <cstddef>
#include <cstdint>
#include <string>

struct XXH3_state_s;  // xxhash.h's, kept out of the public headers

namespace fsdp::checksum {

/// A hash a file of ours may carry.
enum class Algorithm {
  kFnv1a64,  ///< FNV-1a 64, byte at a time: files written before algorithms were named (read only)
  kXxh3_64   ///< XXH3-64 (xxHash): what every file is written with now
};

/// What every file written now carries.
constexpr Algorithm kWritten = Algorithm::kXxh3_64;
/// What a file that names no algorithm carries (written before they were named).
constexpr Algorithm kUnnamed = Algorithm::kFnv1a64;

/// The name a file records: "fnv1a64", "xxh3_64".
const char* algorithm_name(Algorithm algorithm);
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
