#include "fsdp/options.h"

#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace fsdp {
namespace {

const std::vector<std::pair<const char*, ShardingStrategy>>& strategies() {
  static const std::vector<std::pair<const char*, ShardingStrategy>> table = {
      {"no_shard", ShardingStrategy::kNoShard},
      {"zero1", ShardingStrategy::kZero1},
      {"shard_grad_op", ShardingStrategy::kShardGradOp},
      {"full_shard", ShardingStrategy::kFullShard},
      {"hybrid_shard", ShardingStrategy::kHybridShard},
      {"hybrid_shard_zero2", ShardingStrategy::kHybridShardZero2}};
  return table;
}

}  // namespace

const char* strategy_name(ShardingStrategy strategy) {
  for (const auto& [name, s] : strategies())
    if (s == strategy) return name;
  return "unknown";
}

ShardingStrategy parse_strategy(const std::string& name) {
  std::string known;
  for (const auto& [n, s] : strategies()) {
    if (name == n) return s;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  TORCH_CHECK(false, "unknown sharding strategy '", name, "': expected one of ", known);
}

bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardZero2;
}

bool keeps_params_unsharded(ShardingStrategy s) {
  return s == ShardingStrategy::kNoShard || s == ShardingStrategy::kZero1;
}

bool keeps_full_gradients(ShardingStrategy s) { return keeps_params_unsharded(s); }

bool reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard;
}

const char* backward_prefetch_name(BackwardPrefetch prefetch) {
  switch (prefetch) {
    case BackwardPrefetch::kNone: return "none";
    case BackwardPrefetch::kPre: return "pre";
    case BackwardPrefetch::kPost: return "post";
  }
  return "unknown";
}

BackwardPrefetch parse_backward_prefetch(const std::string& name) {
  for (auto p : {BackwardPrefetch::kNone, BackwardPrefetch::kPre, BackwardPrefetch::kPost}) {
    if (name == backward_prefetch_name(p)) return p;
  }
  TORCH_CHECK(false, "unknown backward prefetch '", name, "': expected none, pre or post");
}

const char* quantization_name(Quantization quantization) {
  switch (quantization) {
    case Quantization::kNone: return "none";
    case Quantization::kInt8: return "int8";
  }
  return "unknown";
}

Quantization parse_quantization(const std::string& name) {
  for (auto q : {Quantization::kNone, Quantization::kInt8}) {
    if (name == quantization_name(q)) return q;
  }
  TORCH_CHECK(false, "unknown quantization '", name, "': expected none or int8");
}

torch::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return torch::kFloat;
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16") return torch::kHalf;
  TORCH_CHECK(false, "unknown dtype '", name, "': expected fp32, bf16 or fp16");
}

const char* dtype_name(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return "fp32";
    case torch::kBFloat16: return "bf16";
    case torch::kHalf: return "fp16";
    default: return c10::toString(type);
  }
}

NvmeStepSchedule nvme_step_schedule(const NvmeOffloadOptions& nvme, ShardingStrategy strategy, bool clips_gradients,
                                    bool scales_loss) {
  if (!nvme.step_in_backward() || keeps_full_gradients(strategy)) return NvmeStepSchedule::kAfterBackward;
  if (!clips_gradients && !scales_loss) return NvmeStepSchedule::kInBackward;
  return nvme.gradient_slots() ? NvmeStepSchedule::kBeforeNextGather : NvmeStepSchedule::kAfterBackward;
}

}  // namespace fsdp
