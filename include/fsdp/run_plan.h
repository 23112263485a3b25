#pragma once
/// \file
/// One run's plan: its step's peak memory by category, its traffic, its disk
/// offload and its checkpoint staging, worked out in one place from the
/// model's description, fully_shard's options and the run's settings.
/// fsdp-train's prediction, its preflight (host_memory.h) and fsdp-plan each
/// make theirs with plan_run, so that all three give one figure for one run.

#include <cstdint>
#include <optional>
#include <vector>

#include "fsdp/memory_plan.h"
#include "fsdp/options.h"

namespace fsdp {

/// What a model tells the planner of itself (models::GPTConfig and
/// models::LlamaConfig give theirs, before any tensor exists).
struct ModelDescription {
  /// Its dimensions, the per-rank batch, and the activations a layer keeps
  /// beyond the reference GPT block's (TransformerShape::extra_layer_activations).
  TransformerShape shape;
  /// The element counts of the units fully_shard makes of it, the root first:
  /// one unit per layer, and one per attention and per MLP (the trainer's
  /// `--wrap sublayer`, whose layer norms then belong to the root).
  ///@{
  std::vector<int64_t> layer_units, sublayer_units;
  ///@}
  /// The units of one wrap: sublayer_units or layer_units.
  const std::vector<int64_t>& units(bool sublayer) const { return sublayer ? sublayer_units : layer_units; }
  /// The parameters' element count.
  int64_t num_parameters() const;
};

/// What a run adds to fully_shard's options for its plan.
struct RunSettings {
  int world = 1;           ///< ranks in all
  int ranks_per_node = 0;  ///< ranks a host (the hybrids shard over them); 0: every rank on one host
  int64_t micro_steps = 1;  ///< gradient accumulation (disk offload reads the parameters in each)
  /// Whether the step clips gradients or scales the loss: then disk offload
  /// steps after backward (nvme_steps_in_backward).
  ///@{
  bool clips_gradients = false, scales_loss = false;
  ///@}
  /// FsdpState::gathers_run_ahead(): a device's gathers run ahead of its
  /// compute and hold the previous resharded unit's buffer while the next
  /// gather runs (one more unit, the largest but the root).
  bool gathers_run_ahead = false;
  /// Asynchronous checkpoints: a save's staging copy stays beside the steps,
  /// in the full format (rank 0 stages the gathered model) or the sharded one.
  ///@{
  bool async_checkpoint = false, full_checkpoint = false;
  ///@}
};

/// A run's plan, per rank (plan_run).
struct RunPlan {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  ///< the options' strategy
  std::vector<int64_t> unit_numels;  ///< the units planned, the root first
  int ranks_per_node = 1;  ///< ranks a host, as planned (the world on one host)
  int shard_group = 1;     ///< the shard group's size (shard_group_size)
  /// The in-memory step's peak by category, the model's own activations and
  /// a run-ahead gather's buffer included.
  StepPeak peak;
  /// With FullyShardOptions::nvme_offload: what leaves memory, and the disk traffic.
  std::optional<NvmeOffloadPlan> nvme;
  /// The step's peak tensor bytes: peak.total(), or peak_with_nvme_offload.
  int64_t step_peak = 0;
  /// One step's collective bytes by kind.
  CommBytes comm;
  /// The asynchronous checkpoints' staging (zeros without them).
  CheckpointStaging staging;
};

/// The plan of a run of `model`'s `options.activation_checkpointing()` and
/// wrap (`sublayer`: a unit per attention and per MLP), with fully_shard's
/// `options` (strategy, precision, prefetch, ZeRO++, disk offload) and the
/// run's `settings`. Throws where the options refuse the world
/// (check_zero_plus_plus_plan, a hybrid's node size).
RunPlan plan_run(const ModelDescription& model, bool sublayer, const FullyShardOptions& options,
                 const RunSettings& settings);

}  // namespace fsdp
