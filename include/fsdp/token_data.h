#pragma once
/// \file
/// Token streams and the data orders of shared/spec/gpt.md, identical for
/// every world size.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "fsdp/enum_names.h"

namespace fsdp::models {

/// The order sequences are read in (shared/spec/gpt.md).
/// Named by enum_name, parsed by parse_enum: "sequential", "shuffled".
enum class DataOrder {
  kSequential,  ///< a global batch is G consecutive sequences (the spec's base order)
  kShuffled     ///< each sequence's start is splitmix64 of its global index
};

}  // namespace fsdp::models
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<models::DataOrder>);  ///< "sequential", "shuffled"
}  // namespace fsdp::detail
namespace fsdp::models {

/// The library's defaults are the spec's base order over the whole file, so
/// that a plain TokenData(path, T, V) reads what it always read; fsdp-train
/// defaults to shuffled with a 10% validation tail, as the spec does for training.
struct TokenDataOptions {
  /// The data order (sequential by default).
  TokenDataOptions& order(DataOrder v) { order_ = v; return *this; }
  /// The shuffled order's seed (0 by default).
  TokenDataOptions& seed(uint64_t v) { seed_ = v; return *this; }
  /// The last ceil(f * n) tokens are held out for validation; 0: none.
  TokenDataOptions& val_fraction(double v) { val_fraction_ = v; return *this; }
  /// The settings above, read back.
  ///@{
  DataOrder order() const { return order_; }
  uint64_t seed() const { return seed_; }
  double val_fraction() const { return val_fraction_; }
  ///@}

 private:
  DataOrder order_ = DataOrder::kSequential;
  uint64_t seed_ = 0;
  double val_fraction_ = 0.0;
};

/// A token file, memory-mapped, with the spec's training batches and a
/// held-out validation tail.
class TokenData {
 public:
  /// Raw bytes (one token per byte), a .bin file of little-endian uint16
  /// token ids, or a .u32 file of little-endian uint32 token ids (no header;
  /// fsdp-data writes it for vocabularies over 65,536). Throws, naming the file, if its training part cannot hold one
  /// sequence of `context` tokens, its validation part (if any) cannot either,
  /// or it holds a token id >= vocab. The file is memory-mapped, not read:
  /// a rank's memory does not grow with its size (the token range is checked
  /// in one streaming pass that gives each chunk's pages back as it goes), and
  /// ranks of a host share the page cache's one copy.
  TokenData(const std::string& path, int64_t context, int64_t vocab, TokenDataOptions options = {});

  /// The file's tokens, n.
  int64_t size() const { return size_; }
  /// n_train: the tokens before the validation tail.
  int64_t train_size() const { return size() - val_size_; }
  /// n_val: the validation tail's tokens (0 without a split).
  int64_t val_size() const { return val_size_; }
  /// The file.
  const std::string& path() const { return path_; }
  /// The order, seed and validation fraction it was opened with.
  const TokenDataOptions& options() const { return options_; }

  /// Where sequence j of global step s starts (global batch of `global` sequences).
  int64_t train_start(int64_t step, int64_t j, int64_t global) const;

  /// The [batch, context] inputs and targets of micro-step `micro` of `rank`
  /// in global step `step` (world ranks, accum micro-steps per step).
  std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int64_t micro, int64_t rank, int64_t world,
                                                int64_t accum, int64_t batch) const;

  /// Validation sequences first .. first + count - 1, as [count, context]
  /// inputs and targets. Throws without a validation split.
  std::pair<torch::Tensor, torch::Tensor> val_batch(int64_t first, int64_t count) const;

 private:
  std::pair<torch::Tensor, torch::Tensor> gather(const std::vector<int64_t>& starts) const;

  std::string path_;
  int64_t context_;
  TokenDataOptions options_;
  int64_t val_size_ = 0;
  int64_t token(int64_t i) const {
    if (token_bytes_ == 2) return bytes_[2 * i] | (bytes_[2 * i + 1] << 8);
    if (token_bytes_ == 4) {
      const unsigned char* b = bytes_ + 4 * i;
      return int64_t{b[0]} | (int64_t{b[1]} << 8) | (int64_t{b[2]} << 16) | (int64_t{b[3]} << 24);
    }
    return bytes_[i];
  }
  std::shared_ptr<const void> mapping_;  // unmaps when the last copy goes
  const unsigned char* bytes_ = nullptr;
  int64_t token_bytes_ = 1;              // 1 raw, 2 .bin, 4 .u32
  int64_t size_ = 0;                      // tokens
};

}  // namespace fsdp::models
