#pragma once
/// \file
/// Token streams and the data orders of shared/spec/gpt.md, identical for
/// every world size.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
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

class TokenFile;  // the mapped file of ids (the library's own)

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
  int64_t size() const;
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
  std::shared_ptr<const TokenFile> file_;  // the mapped ids, shared by copies
};

/// One micro-batch of packed conversations (ConversationData::batch).
struct PackedBatch {
  torch::Tensor inputs;     ///< [B, T] int64
  torch::Tensor targets;    ///< [B, T] int64: -100 where no loss is taken (prompts, padding, a conversation's end)
  torch::Tensor positions;  ///< [B, T] int64, restarting at each conversation (SequencePacking::from_positions)
  int64_t loss_targets = 0;  ///< the targets that are not -100
};

/// How ConversationData holds out, packs and orders its conversations.
struct ConversationDataOptions {
  /// The order of the packed rows: sequential (row k mod rows), or shuffled
  /// (a new permutation of the rows each epoch, from the seed). Shuffled by default.
  ConversationDataOptions& order(DataOrder v) { order_ = v; return *this; }
  /// The shuffled order's seed (0 by default).
  ConversationDataOptions& seed(uint64_t v) { seed_ = v; return *this; }
  /// The last ceil(f * n) conversations are held out for validation; 0: none (the default).
  ConversationDataOptions& val_fraction(double v) { val_fraction_ = v; return *this; }
  /// Pack several conversations into a row (best fit, the default), or one a row padded to the context.
  ConversationDataOptions& pack(bool v) { pack_ = v; return *this; }
  /// The settings above, read back.
  ///@{
  DataOrder order() const { return order_; }
  uint64_t seed() const { return seed_; }
  double val_fraction() const { return val_fraction_; }
  bool pack() const { return pack_; }
  ///@}

 private:
  DataOrder order_ = DataOrder::kShuffled;
  uint64_t seed_ = 0;
  double val_fraction_ = 0.0;
  bool pack_ = true;
};

/// Conversations as `fsdp-data encode-chat` writes them, packed into rows of
/// `context` tokens: `path` holds the token ids (as TokenData reads them),
/// `path`.mask one byte a token (1 where the token is a target that carries
/// loss: an answer's), and `path`.conversations the little-endian uint64
/// offsets o_0 = 0 < o_1 < ... < o_n = the token count, conversation i being
/// tokens [o_i, o_{i+1}). A conversation of L tokens takes L - 1 slots of a
/// row (its inputs predict its tokens 1 ... L - 1); rows are filled best-fit
/// by decreasing length and never split a conversation; a longer one is cut
/// to context + 1 tokens (counted: truncated()). The packing and the order
/// depend on nothing but the files and the options, so every world size
/// reads the same global batches.
class ConversationData {
 public:
  /// Reads and packs; throws, naming the file, for a missing or inconsistent
  /// mask or offsets file, a token id >= vocab, no conversation with a target
  /// that carries loss, or a validation split that holds none.
  ConversationData(const std::string& path, int64_t context, int64_t vocab, ConversationDataOptions options = {});
  /// Whether `path` has the sidecar files of conversations (path.conversations).
  static bool has_conversations(const std::string& path);

  /// The [batch, context] rows of micro-step `micro` of `rank` in global
  /// step `step` (world ranks, accum micro-steps per step): rows s G + j
  /// of the order, j = (micro W + rank) batch + b, as TokenData's batches.
  PackedBatch batch(int64_t step, int64_t micro, int64_t rank, int64_t world, int64_t accum, int64_t batch) const;
  /// The targets that carry loss in global step `step`'s `global` rows, the
  /// same on every rank (TrainStep::token_loss_divisor).
  int64_t global_loss_targets(int64_t step, int64_t global) const;
  /// Validation rows first .. first + count - 1; a row at or past val_rows()
  /// is a blank one (no targets), so that every rank runs as many forwards.
  PackedBatch val_batch(int64_t first, int64_t count) const;

  /// The rows packed from the training and from the held-out conversations.
  ///@{
  int64_t train_rows() const { return static_cast<int64_t>(train_.size()); }
  int64_t val_rows() const { return static_cast<int64_t>(val_.size()); }
  ///@}
  /// The conversations trained on, and held out.
  ///@{
  int64_t train_conversations() const { return train_conversations_; }
  int64_t val_conversations() const { return val_conversations_; }
  ///@}
  /// The training rows' targets that carry loss (an epoch's answer tokens).
  int64_t train_loss_targets() const { return train_loss_targets_; }
  /// The training rows' slots that hold a conversation's token, over all
  /// their slots (train_rows() x context): 1 - the padding's share.
  double packing_efficiency() const { return packing_efficiency_; }
  /// Conversations longer than context + 1 tokens, cut to it here.
  int64_t truncated() const { return truncated_; }
  /// Conversations left out for having no target that carries loss (after
  /// any cut): they would be compute without a gradient.
  int64_t skipped() const { return skipped_; }
  /// The token file.
  const std::string& path() const { return path_; }

 private:
  /// A conversation in the token file: `length` tokens from `begin` (length - 1 slots of a row).
  struct Span {
    int64_t begin, length;  ///< where it starts, and its tokens
  };
  using Row = std::vector<Span>;
  std::vector<Row> pack_rows(std::vector<Span> spans) const;
  PackedBatch gather(const std::vector<const Row*>& rows) const;
  int64_t train_row(int64_t k) const;
  int64_t row_loss_targets(const Row& row) const;
  std::vector<Span> read_spans();

  std::string path_;
  int64_t context_;
  ConversationDataOptions options_;
  std::shared_ptr<const TokenFile> tokens_, mask_;
  std::vector<Row> train_, val_;
  std::vector<int64_t> train_row_targets_;  // each training row's targets that carry loss
  int64_t train_conversations_ = 0, val_conversations_ = 0, train_loss_targets_ = 0, truncated_ = 0, skipped_ = 0;
  double packing_efficiency_ = 0.0;
  mutable std::mutex permutation_mutex_;  // batch() may be called from several threads
  mutable int64_t permuted_epoch_ = -1;   // the epoch whose permutation permutation_ holds
  mutable std::vector<int64_t> permutation_;
};

}  // namespace fsdp::models
