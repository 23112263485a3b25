#pragma once
// One unit's parameters as one flat, padded buffer (FSDP1's layout): rank r
// keeps elements [r*S, (r+1)*S) as its shard, S = ceil(N / W). One
// all-gather and one reduce-scatter per unit move the whole unit.
//
// Why flat rather than per-parameter (FSDP2): the unit's collectives are one
// contiguous buffer with no copy-in/copy-out, and the optimizer sees one leaf
// per unit. Name-keyed state dicts are recovered from the recorded offsets
// (entries()), so nothing user-facing is keyed by flat positions.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp {

struct FlatParamEntry {
  std::string name;      // qualified parameter name
  torch::Tensor param;   // the module's parameter (its data is a view while unsharded)
  std::vector<int64_t> shape;
  int64_t offset = 0;    // in the unsharded flat buffer
  int64_t numel = 0;
};

class FlatParam {
 public:
  // Takes the parameters' current values (float32, CPU) as the initial model
  // (every rank must pass the same values) and frees them: from here on the parameters
  // hold data only while unsharded.
  FlatParam(std::vector<std::pair<std::string, torch::Tensor>> params, ProcessGroupPtr group);

  int64_t numel() const { return numel_; }                // real elements
  int64_t padded_numel() const { return shard_numel_ * group_->size(); }
  int64_t shard_numel() const { return shard_numel_; }
  // The local shard: an fp32 leaf that optimizers step. Padding stays zero.
  const torch::Tensor& shard() const { return shard_; }
  const std::vector<FlatParamEntry>& entries() const { return entries_; }
  bool is_unsharded() const { return unsharded_storage_bytes() > 0; }

  // All-gathers the shards; the parameters become views into the result.
  void unshard();
  // Points the parameters at empty tensors and frees the unsharded buffer.
  void reshard();

  // Flattens the parameters' gradients (zeros where a parameter got none),
  // drops them, and starts the averaging reduce-scatter into this rank's
  // slice. finish_reduce_gradients() waits and accumulates into shard().grad().
  void start_reduce_gradients();
  void finish_reduce_gradients();
  bool reduce_pending() const { return pending_reduce_ != nullptr; }

 private:
  size_t unsharded_storage_bytes() const;

  ProcessGroupPtr group_;
  std::vector<FlatParamEntry> entries_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  torch::Tensor shard_;
  // Keeps one storage for the unit's whole life, freed and refilled in place,
  // so views that autograd saved during forward see the refilled data in
  // backward (and do not keep the memory alive in between).
  torch::Tensor unsharded_;
  WorkHandle pending_reduce_;
  torch::Tensor pending_grad_shard_;
};

}  // namespace fsdp
