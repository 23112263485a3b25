#pragma once
// A file of token ids, memory-mapped: what TokenData and ConversationData
// read their tokens from (fsdp/token_data.h says the formats).

#include <cstdint>
#include <memory>
#include <string>

namespace fsdp::models {

/// Raw bytes (one token per byte), a .bin of little-endian uint16 ids, or a
/// .u32 of little-endian uint32 ids, mapped read-only: a rank's memory does
/// not grow with the file, and the ranks of a host share the page cache's copy.
class TokenFile {
 public:
  /// Maps `path`; throws, naming it, if it cannot be opened or mapped, is not
  /// a regular file, or its size is not a whole number of tokens.
  explicit TokenFile(const std::string& path);
  /// Throws, naming the file and the position, at the first id >= vocab; in
  /// one streaming pass that gives each chunk's pages back as it goes.
  void check_ids_below(int64_t vocab) const;
  /// The tokens, n.
  int64_t size() const { return size_; }
  /// The file.
  const std::string& path() const { return path_; }
  /// Token i (0 <= i < size()).
  int64_t token(int64_t i) const {
    if (token_bytes_ == 2) return bytes_[2 * i] | (bytes_[2 * i + 1] << 8);
    if (token_bytes_ == 4) {
      const unsigned char* b = bytes_ + 4 * i;
      return int64_t{b[0]} | (int64_t{b[1]} << 8) | (int64_t{b[2]} << 16) | (int64_t{b[3]} << 24);
    }
    return bytes_[i];
  }

 private:
  std::string path_;
  std::shared_ptr<const void> mapping_;  // unmaps when the last copy goes
  const unsigned char* bytes_ = nullptr;
  int64_t token_bytes_ = 1;  // 1 raw, 2 .bin, 4 .u32
  int64_t size_ = 0;         // tokens
};

}  // namespace fsdp::models
