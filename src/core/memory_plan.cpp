#include "fsdp/memory_plan.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp {

int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node) {
  if (strategy == ShardingStrategy::kNoShard) return 1;
  if (!is_hybrid(strategy)) return world;
  TORCH_CHECK(ranks_per_node > 0 && world % ranks_per_node == 0, "hybrid sharding needs ranks_per_node dividing ",
              world, ", got ", ranks_per_node);
  return ranks_per_node;
}

ModelStateBytes estimate_model_state(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                     int ranks_per_node, const MixedPrecision& mixed_precision,
                                     int64_t optimizer_bytes_per_element) {
  const int64_t K = shard_group_size(strategy, world, ranks_per_node);
  const int64_t p = c10::elementSize(mixed_precision.param_dtype());
  const bool low_precision = mixed_precision.param_dtype() != c10::ScalarType::Float;
  ModelStateBytes bytes;
  int64_t largest_other_unit = 0;
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t n = unit_numels[u];
    const int64_t shard = (n + K - 1) / K, padded = shard * K;
    if (!keeps_params_unsharded(strategy)) {
      if (!reshards_after_forward(strategy)) {
        bytes.gathered_peak += p * padded;
      } else if (u == 0) {
        bytes.gathered_peak += p * padded;  // the root's forward and backward span every other unit's
      } else {
        largest_other_unit = std::max(largest_other_unit, p * padded);
      }
    }
    bytes.optimizer += optimizer_bytes_per_element * shard;
    if (keeps_params_unsharded(strategy)) {
      bytes.params += low_precision ? p * padded + 4 * shard : 4 * padded;
      bytes.grads += 4 * padded;
    } else {
      bytes.params += 4 * shard;
      bytes.grads += 4 * shard;
    }
  }
  bytes.gathered_peak += largest_other_unit;
  return bytes;
}

}  // namespace fsdp
