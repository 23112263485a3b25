#pragma once
// What each sharding strategy implies for the engine, and the disk offload's
// step schedule: rules the engine, the planner and the trainer share, the
// engine's own (not installed).

#include "fsdp/options.h"

namespace fsdp {

/// Shards inside a node and replicates across nodes (hybrid_shard, hybrid_shard_zero2).
bool is_hybrid(ShardingStrategy strategy);
/// Parameters stay unsharded between steps (no_shard, zero1).
bool keeps_params_unsharded(ShardingStrategy strategy);
/// Gradients are reduced into a full-size, replicated buffer (no_shard, zero1).
bool keeps_full_gradients(ShardingStrategy strategy);
/// Parameters are freed after forward and gathered again for backward.
bool reshards_after_forward(ShardingStrategy strategy);

/// When a disk-offloaded run's optimizer updates each unit. The one rule:
/// the engine (NvmeOffload, each step) and the planner (plan_run) both ask it.
enum class NvmeStepSchedule {
  /// In the optimizer step, after backward: not asked for
  /// (NvmeOffloadOptions::step_in_backward), a strategy that keeps whole
  /// gradients and hands none over (no_shard, zero1), or a clipped or
  /// loss-scaled step with nowhere to write the gradients (gradient_slots off).
  kAfterBackward,
  /// Each unit as its gradient is reduced: asked for, and nothing needs every
  /// gradient first (no clipping, no loss scaling).
  kInBackward,
  /// Each gradient written out in backward, and its unit stepped just before
  /// its next gather: asked for, with gradient slots, in a step that clips or
  /// scales the loss.
  kBeforeNextGather,
};
/// The schedule of a run offloading to disk with `nvme`, in `strategy`,
/// whose step clips the gradients or scales the loss.
NvmeStepSchedule nvme_step_schedule(const NvmeOffloadOptions& nvme, ShardingStrategy strategy, bool clips_gradients,
                                    bool scales_loss);

}  // namespace fsdp
