// Conversations packed into rows without attention across them
// (fsdp/token_data.h's ConversationData): the encode-chat files read, the
// rows packed best-fit, and the rows' order, the same for every world size.

#include "fsdp/token_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "models/splitmix64.h"
#include "models/token_file.h"

namespace fsdp::models {
namespace {

constexpr int64_t kIgnoredTarget = -100;  // cross_entropy's ignore_index

// path.conversations: n + 1 little-endian uint64 offsets from 0 to the token count, increasing.
std::vector<int64_t> read_offsets(const std::string& path, int64_t tokens) {
  const std::string file = path + ".conversations";
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK(in, "cannot open '", file, "': the conversations' offsets that fsdp-data encode-chat writes beside '",
              path, "'");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TORCH_CHECK(bytes.size() >= 16 && bytes.size() % 8 == 0, "'", file, "' holds ", bytes.size(),
              " bytes: expected little-endian uint64 offsets, at least two");
  std::vector<int64_t> offsets(bytes.size() / 8);
  for (size_t i = 0; i < offsets.size(); ++i) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = (v << 8) | bytes[8 * i + b];
    offsets[i] = static_cast<int64_t>(v);
    TORCH_CHECK(i == 0 ? v == 0 : offsets[i] > offsets[i - 1] && offsets[i] <= tokens, "'", file, "': offset ", i,
                " is ", v, ", expected ", i == 0 ? "0" : "more than the one before and at most the token count ",
                i == 0 ? "" : std::to_string(tokens));
  }
  TORCH_CHECK(offsets.back() == tokens, "'", file, "' ends at token ", offsets.back(), " but '", path, "' holds ",
              tokens, " tokens");
  return offsets;
}

}  // namespace

bool ConversationData::has_conversations(const std::string& path) {
  return std::filesystem::exists(path + ".conversations");
}

// The conversations of the files, each cut to context + 1 tokens; the
// validation split taken by count; the ones without a target left out.
std::vector<ConversationData::Span> ConversationData::read_spans() {
  tokens_ = std::make_shared<const TokenFile>(path_);
  mask_ = std::make_shared<const TokenFile>(path_ + ".mask");
  TORCH_CHECK(mask_->size() == tokens_->size(), "'", path_, ".mask' holds ", mask_->size(), " bytes for the ",
              tokens_->size(), " tokens of '", path_, "': expected one a token");
  const std::vector<int64_t> offsets = read_offsets(path_, tokens_->size());
  std::vector<Span> spans;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    Span span{offsets[i], offsets[i + 1] - offsets[i]};
    if (span.length > context_ + 1) {
      span.length = context_ + 1;
      ++truncated_;
    }
    spans.push_back(span);
  }
  return spans;
}

ConversationData::ConversationData(const std::string& path, int64_t context, int64_t vocab,
                                   ConversationDataOptions options)
    : path_(path), context_(context), options_(options) {
  const double f = options.val_fraction();
  TORCH_CHECK(f >= 0.0 && f < 1.0, "the validation fraction must be in [0, 1), got ", f);
  TORCH_CHECK(context > 0, "the context must be positive, got ", context);
  std::vector<Span> spans = read_spans();
  tokens_->check_ids_below(vocab);
  for (int64_t i = 0; i < mask_->size(); ++i) {
    TORCH_CHECK(mask_->token(i) <= 1, "'", path, ".mask' has ", mask_->token(i), " at token ", i,
                ": expected 0 (no loss) or 1 (a target that carries loss)");
  }
  const auto n = static_cast<int64_t>(spans.size());
  const auto held_out = static_cast<int64_t>(std::ceil(f * static_cast<double>(n)));
  std::vector<Span> train, val;
  for (int64_t i = 0; i < n; ++i) {
    if (row_loss_targets({spans[i]}) == 0) {
      ++skipped_;
      continue;
    }
    (i < n - held_out ? train : val).push_back(spans[i]);
  }
  TORCH_CHECK(!train.empty(), "'", path, "' has no training conversation with a target that carries loss (",
              n, " conversations, ", held_out, " held out for validation, ", skipped_, " without one)",
              held_out > 0 ? ": lower the validation fraction (--val-fraction 0: none)" : "");
  TORCH_CHECK(held_out == 0 || !val.empty(), "'", path, "': the validation split of ", f, " holds out ", held_out,
              " conversations, none with a target that carries loss (raise the fraction, or 0 for no validation: "
              "--val-fraction 0)");
  train_conversations_ = static_cast<int64_t>(train.size());
  val_conversations_ = static_cast<int64_t>(val.size());
  int64_t slots = 0;
  for (const Span& span : train) slots += span.length - 1;
  train_ = pack_rows(std::move(train));
  val_ = pack_rows(std::move(val));
  for (const Row& row : train_) train_row_targets_.push_back(row_loss_targets(row));
  train_loss_targets_ = std::accumulate(train_row_targets_.begin(), train_row_targets_.end(), int64_t{0});
  packing_efficiency_ = static_cast<double>(slots) / static_cast<double>(train_rows() * context_);
}

// Best fit by decreasing length (ties in file order): each conversation goes
// to the row it fills the most, or starts a row. Without packing, one a row.
std::vector<ConversationData::Row> ConversationData::pack_rows(std::vector<Span> spans) const {
  std::vector<Row> rows;
  if (!options_.pack()) {
    for (const Span& span : spans) rows.push_back({span});
    return rows;
  }
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.length > b.length; });
  std::multimap<int64_t, size_t> room;  // free slots -> row
  for (const Span& span : spans) {
    const int64_t slots = span.length - 1;
    auto best = room.lower_bound(slots);
    if (best == room.end()) {
      rows.push_back({span});
      room.emplace(context_ - slots, rows.size() - 1);
      continue;
    }
    const size_t row = best->second;
    const int64_t left = best->first - slots;
    room.erase(best);
    rows[row].push_back(span);
    room.emplace(left, row);
  }
  return rows;
}

int64_t ConversationData::row_loss_targets(const Row& row) const {
  int64_t count = 0;
  for (const Span& span : row) {
    for (int64_t i = 1; i < span.length; ++i) count += mask_->token(span.begin + i);
  }
  return count;
}

PackedBatch ConversationData::gather(const std::vector<const Row*>& rows) const {
  const int64_t T = context_, B = static_cast<int64_t>(rows.size());
  PackedBatch batch;
  batch.inputs = torch::zeros({B, T}, torch::kLong);  // padding reads token 0, a sequence of its own
  batch.targets = torch::full({B, T}, kIgnoredTarget, torch::kLong);
  batch.positions = torch::empty({B, T}, torch::kLong);
  int64_t* x = batch.inputs.data_ptr<int64_t>();
  int64_t* y = batch.targets.data_ptr<int64_t>();
  int64_t* p = batch.positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = b * T;
    for (const Span& span : rows[b] ? *rows[b] : Row()) {
      for (int64_t i = 0; i + 1 < span.length; ++i, ++t) {
        x[t] = tokens_->token(span.begin + i);
        p[t] = i;
        if (mask_->token(span.begin + i + 1)) {
          y[t] = tokens_->token(span.begin + i + 1);
          ++batch.loss_targets;
        }
      }
    }
    for (int64_t i = 0; t < (b + 1) * T; ++i, ++t) p[t] = i;
  }
  return batch;
}

// Row k of the order: sequential k mod rows; shuffled, epoch k / rows read
// through its own permutation (Fisher-Yates driven by splitmix64 of the
// seed, the epoch and the place), so that every row is read once an epoch.
int64_t ConversationData::train_row(int64_t k) const {
  const int64_t rows = train_rows(), epoch = k / rows, place = k % rows;
  if (options_.order() == DataOrder::kSequential) return place;
  const std::lock_guard<std::mutex> lock(permutation_mutex_);
  if (permuted_epoch_ != epoch) {
    permutation_.resize(rows);
    std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
    const uint64_t stream = splitmix64(options_.seed() * 0x100000000ULL + static_cast<uint64_t>(epoch));
    for (int64_t i = rows - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(splitmix64(stream + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[i], permutation_[j]);
    }
    permuted_epoch_ = epoch;
  }
  return permutation_[place];
}

PackedBatch ConversationData::batch(int64_t step, int64_t micro, int64_t rank, int64_t world, int64_t accum,
                                    int64_t batch) const {
  const int64_t global = batch * world * accum;
  std::vector<const Row*> rows(batch);
  for (int64_t b = 0; b < batch; ++b) rows[b] = &train_[train_row(step * global + (micro * world + rank) * batch + b)];
  return gather(rows);
}

int64_t ConversationData::global_loss_targets(int64_t step, int64_t global) const {
  int64_t count = 0;
  for (int64_t j = 0; j < global; ++j) count += train_row_targets_[train_row(step * global + j)];
  return count;
}

PackedBatch ConversationData::val_batch(int64_t first, int64_t count) const {
  TORCH_CHECK(!val_.empty(), "'", path_, "' has no validation split (the validation fraction is 0)");
  std::vector<const Row*> rows(count);
  for (int64_t i = 0; i < count; ++i) rows[i] = first + i < val_rows() ? &val_[first + i] : nullptr;
  return gather(rows);
}

}  // namespace fsdp::models
