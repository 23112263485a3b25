#include "fsdp/options.h"
#include "core/strategy_rules.h"

#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace fsdp {
namespace detail {

const EnumNames& enum_names(EnumTag<ShardingStrategy>) {
  static const EnumNames names = EnumNames::of<ShardingStrategy>("sharding strategy", {
      {ShardingStrategy::kNoShard, "no_shard"},
      {ShardingStrategy::kZero1, "zero1"},
      {ShardingStrategy::kShardGradOp, "shard_grad_op"},
      {ShardingStrategy::kFullShard, "full_shard"},
      {ShardingStrategy::kHybridShard, "hybrid_shard"},
      {ShardingStrategy::kHybridShardZero2, "hybrid_shard_zero2"}});
  return names;
}

const EnumNames& enum_names(EnumTag<BackwardPrefetch>) {
  static const EnumNames names = EnumNames::of<BackwardPrefetch>("backward prefetch", {
      {BackwardPrefetch::kNone, "none"},
      {BackwardPrefetch::kPre, "pre"},
      {BackwardPrefetch::kPost, "post"}});
  return names;
}

const EnumNames& enum_names(EnumTag<Quantization>) {
  static const EnumNames names = EnumNames::of<Quantization>("quantization", {
      {Quantization::kNone, "none"},
      {Quantization::kInt8, "int8"}});
  return names;
}

const EnumNames& enum_names(EnumTag<torch::ScalarType>) {
  static const EnumNames names = EnumNames::of<torch::ScalarType>("dtype", {
      {torch::kFloat, "fp32"},
      {torch::kBFloat16, "bf16"},
      {torch::kHalf, "fp16"},
      {torch::kFloat, "float32"},
      {torch::kBFloat16, "bfloat16"},
      {torch::kHalf, "float16"}},
      [](int value) { return c10::toString(static_cast<torch::ScalarType>(value)); });  // other dtypes: LibTorch's names
  return names;
}

}  // namespace detail

OffloadPolicy OffloadPolicy::cpu() {
  OffloadPolicy policy;
  policy.cpu_ = true;
  return policy;
}

OffloadPolicy OffloadPolicy::nvme(NvmeOffloadOptions options) {
  OffloadPolicy policy;
  policy.nvme_ = std::move(options);
  return policy;
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

NvmeStepSchedule nvme_step_schedule(const NvmeOffloadOptions& nvme, ShardingStrategy strategy, bool clips_gradients,
                                    bool scales_loss) {
  if (!nvme.step_in_backward() || keeps_full_gradients(strategy)) return NvmeStepSchedule::kAfterBackward;
  if (!clips_gradients && !scales_loss) return NvmeStepSchedule::kInBackward;
  return nvme.gradient_slots() ? NvmeStepSchedule::kBeforeNextGather : NvmeStepSchedule::kAfterBackward;
}

}  // namespace fsdp
