#include "fsdp/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/strings.h"
#include "models/splitmix64.h"
#include "models/token_file.h"

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<models::DataOrder>) {
  static const EnumNames names = EnumNames::of<models::DataOrder>("data order", {
      {models::DataOrder::kSequential, "sequential"},
      {models::DataOrder::kShuffled, "shuffled"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::models {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a named pipe would otherwise block the open until a writer came.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TORCH_CHECK(fd >= 0, "cannot open data file '", path, "': ", std::strerror(errno));
  struct stat info {};
  const int stat_rc = ::fstat(fd, &info);
  const int stat_errno = errno;
  const bool regular = stat_rc == 0 && S_ISREG(info.st_mode);
  const size_t file_bytes = regular ? static_cast<size_t>(info.st_size) : 0;
  void* map = file_bytes > 0 ? ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  TORCH_CHECK(stat_rc == 0, "cannot stat data file '", path, "': ", std::strerror(stat_errno));
  TORCH_CHECK(regular, "data file '", path, "' is ", S_ISDIR(info.st_mode) ? "a directory" : "not a regular file",
              ", expected a file of text or token ids");
  TORCH_CHECK(map != MAP_FAILED, "cannot map data file '", path, "' (", file_bytes, " bytes): ",
              std::strerror(map_errno));
  if (map) mapping_ = std::shared_ptr<const void>(map, [file_bytes](const void* p) { ::munmap(const_cast<void*>(p), file_bytes); });
  bytes_ = static_cast<const unsigned char*>(map);
  token_bytes_ = ends_with(path, ".bin") ? 2 : ends_with(path, ".u32") ? 4 : 1;
  TORCH_CHECK(token_bytes_ != 2 || file_bytes % 2 == 0, "data file '", path,
              "' is a .bin of uint16 tokens but has an odd size (", file_bytes, " bytes)");
  TORCH_CHECK(token_bytes_ != 4 || file_bytes % 4 == 0, "data file '", path, "' is a .u32 of uint32 tokens but its ",
              "size (", file_bytes, " bytes) is not a multiple of 4");
  size_ = static_cast<int64_t>(file_bytes) / token_bytes_;
}

void TokenFile::check_ids_below(int64_t vocab) const {
  if (token_bytes_ < 4 && vocab >= (int64_t{1} << (8 * token_bytes_))) return;  // every id the format can hold is in range
  // One pass, a chunk at a time; each chunk's pages are dropped from this
  // process after it is checked (the page cache may keep them).
  constexpr int64_t kChunkTokens = int64_t{1} << 24;
  for (int64_t begin = 0; begin < size_; begin += kChunkTokens) {
    const int64_t end = std::min(size_, begin + kChunkTokens);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = token(i);
      TORCH_CHECK(id < vocab, "data file '", path_, "' has token id ", id, " at position ", i,
                  ", outside the vocabulary of ", vocab, " (set --vocab)");
    }
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = reinterpret_cast<uintptr_t>(bytes_) + (begin * token_bytes_);
    const uintptr_t last = reinterpret_cast<uintptr_t>(bytes_) + (end * token_bytes_);
    const uintptr_t aligned = first / page * page;
    ::madvise(reinterpret_cast<void*>(aligned), last - aligned, MADV_DONTNEED);
  }
}

TokenData::TokenData(const std::string& path, int64_t context, int64_t vocab, TokenDataOptions options)
    : path_(path), context_(context), options_(options) {
  const double f = options.val_fraction();
  TORCH_CHECK(f >= 0.0 && f < 1.0, "the validation fraction must be in [0, 1), got ", f);
  file_ = std::make_shared<const TokenFile>(path);
  // The spec's ceil(f * n), in double as a reference implementation computes it.
  val_size_ = static_cast<int64_t>(std::ceil(f * static_cast<double>(size())));
  // Starts are taken mod (n_train - T - 1) and mod (n_val - T - 1), so each
  // part must exceed T + 1 tokens.
  TORCH_CHECK(train_size() > context + 1, "data file '", path, "' holds ", size(), " tokens, too few for one ",
              "training sequence: need more than context + 1 = ", context + 1, " in its training part (",
              train_size(), " tokens after holding out ", val_size_, " for validation)");
  TORCH_CHECK(val_size_ == 0 || val_size_ > context + 1, "data file '", path, "': the validation split of ", f,
              " holds out ", val_size_, " of its ", size(), " tokens, too few for one validation sequence: need at "
              "least context + 2 = ", context + 2, " (raise the validation fraction, or 0 for no validation)");
  file_->check_ids_below(vocab);
}

int64_t TokenData::size() const { return file_->size(); }

int64_t TokenData::train_start(int64_t step, int64_t j, int64_t global) const {
  const int64_t T = context_;
  const int64_t period = train_size() - T - 1;
  if (options_.order() == DataOrder::kShuffled) {
    // k = s * G + j and the seed's offset wrap mod 2^64, as the spec's arithmetic does.
    const uint64_t k = static_cast<uint64_t>(step) * static_cast<uint64_t>(global) + static_cast<uint64_t>(j);
    return static_cast<int64_t>(splitmix64(k + options_.seed() * 0x100000000ULL) % static_cast<uint64_t>(period));
  }
  // (s * G + j) * T can exceed int64 only after ~1e18 tokens; take it mod
  // the period in two steps anyway.
  const int64_t sequence = ((step % period) * (global % period) + j) % period;
  return (sequence * (T % period)) % period;
}

std::pair<torch::Tensor, torch::Tensor> TokenData::gather(const std::vector<int64_t>& starts) const {
  const int64_t T = context_, rows = static_cast<int64_t>(starts.size());
  torch::Tensor x = torch::empty({rows, T}, torch::kLong);
  torch::Tensor y = torch::empty({rows, T}, torch::kLong);
  auto* xs = x.data_ptr<int64_t>();
  auto* ys = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      xs[b * T + t] = file_->token(starts[b] + t);
      ys[b * T + t] = file_->token(starts[b] + t + 1);
    }
  }
  return {x, y};
}

std::pair<torch::Tensor, torch::Tensor> TokenData::batch(int64_t step, int64_t micro, int64_t rank, int64_t world,
                                                         int64_t accum, int64_t batch) const {
  const int64_t global = batch * world * accum;  // G, sequences per optimizer step
  std::vector<int64_t> starts(batch);
  for (int64_t b = 0; b < batch; ++b) starts[b] = train_start(step, (micro * world + rank) * batch + b, global);
  return gather(starts);
}

std::pair<torch::Tensor, torch::Tensor> TokenData::val_batch(int64_t first, int64_t count) const {
  TORCH_CHECK(val_size_ > 0, "data file '", path_, "' has no validation split (the validation fraction is 0)");
  const int64_t T = context_, period = val_size_ - T - 1;
  std::vector<int64_t> starts(count);
  for (int64_t i = 0; i < count; ++i) starts[i] = train_size() + (((first + i) % period) * (T % period)) % period;
  return gather(starts);
}

}  // namespace fsdp::models
