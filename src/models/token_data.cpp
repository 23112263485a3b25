#include "fsdp/token_data.h"

#include <fstream>
#include <iterator>

namespace fsdp::models {

TokenData::TokenData(const std::string& path, int64_t context, int64_t vocab) : path_(path), context_(context) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open data file '", path, "'");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool uint16 = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  if (uint16) {
    TORCH_CHECK(bytes.size() % 2 == 0, "data file '", path, "' is a .bin of uint16 tokens but has an odd size (",
                bytes.size(), " bytes)");
    tokens_.resize(bytes.size() / 2);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = bytes[2 * i] | (bytes[2 * i + 1] << 8);
  } else {
    tokens_.assign(bytes.begin(), bytes.end());
  }
  // start(s, j) is taken mod (n - T - 1), so n must exceed T + 1.
  TORCH_CHECK(size() > context + 1, "data file '", path, "' holds ", size(), " tokens, too few for one training ",
              "sequence: need more than context + 1 = ", context + 1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    TORCH_CHECK(tokens_[i] < vocab, "data file '", path, "' has token id ", tokens_[i], " at position ", i,
                ", outside the vocabulary of ", vocab, " (set --vocab)");
  }
}

std::pair<torch::Tensor, torch::Tensor> TokenData::batch(int64_t step, int64_t micro, int64_t rank, int64_t world,
                                                         int64_t accum, int64_t batch) const {
  const int64_t T = context_;
  const int64_t global = batch * world * accum;  // G, sequences per optimizer step
  const int64_t period = size() - T - 1;
  torch::Tensor x = torch::empty({batch, T}, torch::kLong);
  torch::Tensor y = torch::empty({batch, T}, torch::kLong);
  auto* xs = x.data_ptr<int64_t>();
  auto* ys = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t j = (micro * world + rank) * batch + b;
    // (s * G + j) * T can exceed int64 only after ~1e18 tokens; take it mod
    // the period in two steps anyway.
    const int64_t sequence = ((step % period) * (global % period) + j) % period;
    const int64_t start = (sequence * (T % period)) % period;
    for (int64_t t = 0; t < T; ++t) {
      xs[b * T + t] = tokens_[start + t];
      ys[b * T + t] = tokens_[start + t + 1];
    }
  }
  return {x, y};
}

}  // namespace fsdp::models
