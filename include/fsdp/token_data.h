#pragma once
// Token streams and the data order of shared/spec/gpt.md, identical for
// every world size.

#include <torch/torch.h>

#include <string>
#include <vector>

namespace fsdp::models {

class TokenData {
 public:
  // Raw bytes (one token per byte), or a .bin file of little-endian uint16
  // token ids. Throws, naming the file, if it cannot hold one training
  // sequence of `context` tokens or holds a token id >= vocab.
  TokenData(const std::string& path, int64_t context, int64_t vocab);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& path() const { return path_; }

  // The [batch, context] inputs and targets of micro-step `micro` of `rank`
  // in global step `step` (world ranks, accum micro-steps per step).
  std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int64_t micro, int64_t rank, int64_t world,
                                                int64_t accum, int64_t batch) const;

 private:
  std::string path_;
  int64_t context_;
  std::vector<int64_t> tokens_;
};

}  // namespace fsdp::models
