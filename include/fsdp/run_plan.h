#pragma once
/// \file
/// One run's plan: its step's peak memory by category, its traffic, its disk
/// offload and its checkpoint staging, worked out in one place from the
/// model's description, fully_shard's options and the run's settings.
/// fsdp-train's prediction, its host-memory preflight (src/plan/host_memory.h) and fsdp-plan each
/// make theirs with plan_run, so that all three give one figure for one run.

#include <cstdint>
#include <optional>
#include <vector>

#include "fsdp/memory_plan.h"
#include "fsdp/model_description.h"
#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"

namespace fsdp {

/// What a run adds to fully_shard's options for its plan.
struct RunSettings {
  int world = 1;           ///< ranks in all
  int ranks_per_node = 0;  ///< ranks a host (the hybrids shard over them); 0: every rank on one host
  int64_t micro_steps = 1;  ///< gradient accumulation (disk offload reads the parameters in each)
  /// Whether the step clips gradients or scales the loss: then disk offload
  /// steps before the next gather, or after backward, as the engine decides.
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
  /// The model's wrap: a unit per attention and per MLP (the trainer's
  /// `--wrap sublayer`; ModelDescription::sublayer_units), else per layer.
  bool sublayer_units = false;
  /// Each unit initialized on its own (the trainer's `--sharded-init`): no
  /// whole model built on every rank first (the host-memory preflight counts it).
  bool sharded_init = false;
  /// The ranks of this host, for its host memory (host_memory_need); 0:
  /// planned for one rank's. Where ranks_per_node is 0 it also gives the
  /// node size: these ranks where they divide the world (as fully_shard
  /// splits), else the world.
  int ranks_here = 0;
};

/// One run as every planner takes it: plan_run, the host-memory preflight
/// (src/plan/host_memory.h) and fsdp-plan. `options` are the options fully_shard
/// takes for the run (strategy, precision, prefetch, ZeRO++, activation
/// checkpointing, disk offload), read as the engine reads them: a variant
/// of the run is a copy with other options.
struct PlannedRun {
  ModelDescription model;      ///< the model's description (its config's plan_description())
  FullyShardOptions options;   ///< fully_shard's options for the run
  RunSettings settings;        ///< what else of the run changes its plan
};

/// A run's plan, per rank (plan_run).
struct RunPlan {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  ///< the options' strategy
  ZeroPlusPlus zero_plus_plus;  ///< the options' ZeRO++ collectives
  int world = 1;                ///< ranks in all
  std::vector<int64_t> unit_numels;  ///< the units planned, the root first (their trainable elements)
  std::vector<int64_t> frozen_numels;  ///< their frozen parts' elements (empty: nothing frozen)
  std::vector<int64_t> nf4_numels;     ///< of those, the NF4 weights' (ModelDescription::nf4; used with frozen_nf4)
  int ranks_per_node = 1;  ///< ranks a host, as planned (the world on one host)
  int shard_group = 1;     ///< the shard group's size: 1 (no_shard), the world, or a host's ranks (hybrids)
  /// The in-memory step's peak by category, the model's own activations and
  /// a run-ahead gather's buffer included.
  StepPeak peak;
  /// With OffloadPolicy::nvme: what leaves memory, and the disk traffic.
  std::optional<NvmeOffloadPlan> nvme;
  /// The step's peak tensor bytes: peak.total(), or with disk offload its own peak.
  int64_t step_peak = 0;
  /// One step's collective bytes by kind.
  CommBytes comm;
  /// The asynchronous checkpoints' staging (zeros without them).
  CheckpointStaging staging;
};

/// The plan of `run`. Throws where its options refuse the world
/// (ZeRO++'s options where the strategy cannot use them, a hybrid's node size).
RunPlan plan_run(const PlannedRun& run);

/// A cluster, for the step-time model (estimate_step_time): what `fsdp-plan
/// --cluster` reads, and `fsdp-plan calibrate` measures.
struct ClusterDescription {
  double flops = 0;  ///< one device's FLOP/s
  /// A link's bandwidth (bytes/s) and latency (s), inside a node and across nodes.
  ///@{
  double intra_bandwidth = 0, intra_latency = 0, inter_bandwidth = 0, inter_latency = 0;
  ///@}
  /// The step's collectives as measured on these hosts (counted bytes per
  /// second of each kind), and how much of the shorter of compute and
  /// communication hid behind the other.
  struct MeasuredCollectives {
    int world = 0;           ///< the ranks they were measured on
    int ranks_per_node = 0;  ///< of which a host held this many
    /// Counted bytes per second: over the world, inside a host, across hosts.
    ///@{
    double all_gather_world = 0, all_gather_world_int8 = 0, reduce_scatter_world = 0, all_gather_host = 0,
           reduce_scatter_host = 0, all_reduce_cross_host = 0, all_to_all_cross_host = 0;
    ///@}
    double overlap = 0;  ///< 0 to 1: the share of the shorter of compute and communication hidden behind the other
  };
  std::optional<MeasuredCollectives> collectives;  ///< measured rates, when calibrated for the hosts
};

/// A step's time on a cluster (estimate_step_time), in seconds.
struct StepTime {
  double comm = 0;        ///< the step's communication
  double step = 0;        ///< the whole step
  double efficiency = 0;  ///< compute / step: 0 to 1
};

/// The step time of `plan` on `cluster`, whose step computes for
/// `compute_seconds`. With collectives measured for the plan's world and
/// hosts (two hosts or more, a sharded strategy): each collective's bytes
/// over its measured rate, summed (one communication thread runs them in
/// turn), and the step is compute plus communication less the measured
/// overlap of the shorter one (the hybrids' all-reduce across hosts, waited
/// for where it is issued, hides behind nothing). Otherwise ring collectives
/// over the links (an all-gather or reduce-scatter of a full buffer of B
/// bytes over k ranks moves (k - 1) / k B over each link in k - 1 steps, an
/// all-reduce twice that), overlapped with compute except the first unit's
/// gather.
StepTime estimate_step_time(const RunPlan& plan, const ClusterDescription& cluster, double compute_seconds);

}  // namespace fsdp
