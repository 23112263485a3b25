#pragma once
// What each strategy keeps per rank, computed from the units' sizes alone:
// the figures a run measures with the counting allocator, to the byte.

#include <cstdint>
#include <vector>

#include "fsdp/options.h"

namespace fsdp {

struct ModelStateBytes {
  int64_t params = 0;     // parameter shards (replicated strategies: the full copies)
  int64_t grads = 0;      // gradient shards (no_shard, zero1: the full reduced gradient)
  int64_t optimizer = 0;  // optimizer state
  // The most gathered (unsharded) parameters held at once during a step, on
  // top of the above: every unit for shard_grad_op (kept from forward to
  // backward), the root and one other unit for full_shard (no prefetch),
  // nothing for no_shard and zero1 (already counted in params).
  int64_t gathered_peak = 0;
  int64_t total() const { return params + grads + optimizer; }
  int64_t total_with_gathered() const { return total() + gathered_peak; }
};

// The shard group size of a strategy: 1 (no_shard), the world (zero1,
// shard_grad_op, full_shard) or the ranks per node (hybrid).
int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node);

// Per rank, at rest between steps, for units of the given element counts
// (the root unit first, as plan_units lists them); optimizer_bytes_per_element
// is 8 for Adam (two fp32 moments).
//   every unit of N elements is padded to Np = ceil(N / K) * K, S = Np / K;
//   no_shard:  params 4N (+ p N low-precision copy), grads 4N, optimizer 8N
//   zero1:     params 4Np (fp32) or p Np + 4S, grads 4Np, optimizer 8S
//   others:    params 4S, grads 4S, optimizer 8S
// (p = bytes of the param dtype; the fp32 master shard is always kept).
ModelStateBytes estimate_model_state(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                     int ranks_per_node, const MixedPrecision& mixed_precision,
                                     int64_t optimizer_bytes_per_element = 8);

}  // namespace fsdp
