#pragma once
/// \file
/// Host-memory planning and the preflight.
///
/// Host-memory planning and the preflight: what a run needs per rank in host
/// memory by the planner (memory_plan.h), against what the host can still
/// give, so that a run that cannot fit is refused before anything is
/// allocated, with the planner's figures and the settings that would fit,
/// instead of an out-of-memory kill minutes later.

#include <cstdint>
#include <string>
#include <vector>

#include "plan/estimates.h"
#include "fsdp/run_plan.h"

namespace fsdp {


// Every function below plans a PlannedRun (run_plan.h) for this host:
// RunSettings::ranks_here of them (0 counts as 1), its sharded_init and
// wrap, and the options' activation checkpointing and disk offload.

/// LibTorch's, MPI's and the data's own memory per rank, beside the tensors
/// (measured 180-250 MiB).
constexpr int64_t kHostRuntimeBytes = int64_t{256} << 20;

/// Per rank: the plan's step peak (RunPlan::step_peak; with disk offload also
/// what the host block cache holds at the peak, reserved bytes that RSS
/// shows: one padded unit in fp32, as measured at xl and 3b; with
/// asynchronous checkpoints also a rank's staging copy,
/// CheckpointStaging::per_rank), or, without sharded initialization, the
/// whole model each rank builds first and flattens, whichever is larger;
/// plus kHostRuntimeBytes.
int64_t host_memory_needed(const RunPlan& plan, bool sharded_init);
/// The same for `run`: host_memory_needed of its plan_run.
int64_t host_memory_needed(const PlannedRun& run);

/// A change of settings the preflight offers, named by fsdp-train's options.
struct HostMemoryVariant {
  std::string flags;  ///< e.g. `--sharded-init --activation-checkpointing`
  PlannedRun run;     ///< the run with that change applied (its options, its settings)
};
/// The variants offered for `run`, from the least change on (the disk
/// offload of parameters only where the strategy shards them, and for fp32
/// parameters unless the optimizer state goes to disk too).
std::vector<HostMemoryVariant> host_memory_variants(const PlannedRun& run);

/// The disk offload's read-ahead (NvmeOffloadOptions::read_ahead) that fits
/// `available` bytes for the ranks of this host: the one `run.options`
/// asks for where it fits, else the deepest shallower one that fits (each
/// unit read ahead holds its shards in memory), else the one asked for (the
/// preflight then refuses the run). Without disk offload, 0.
int fitting_read_ahead(const PlannedRun& run, int64_t available);

/// What a shard group's first rank holds beyond the others while Open MPI
/// reduce-scatters a unit's gradient (bytes): MPI_Reduce_scatter_block
/// (Open MPI 4.1 on one host) reduces the whole gradient onto that rank and
/// scatters it from there, in two buffers of the whole gradient (measured
/// at W = 4: 1.95-1.96x the message, 123 to 463 MB; the other ranks a
/// shard's). Twice the largest unit's gradient, padded to the shard group,
/// in the reduce dtype; 0 where the plan reduce-scatters nothing (no_shard,
/// zero1) or over one rank.
int64_t reduce_scatter_root_bytes(const RunPlan& plan, const MixedPrecision& mixed_precision);

/// A run's host memory: per rank (host_memory_needed); for the ranks of
/// this host, `ranks_here` times that, plus what rank 0 stages beyond the
/// others (asynchronous checkpoints of the full format: the whole model
/// gathered) and the shard groups' first ranks' reduce-scatter buffers
/// (reduce_scatter_root_bytes, for ranks_here / the group's size of them,
/// rounded up, one at least: a host is planned as if it held a group's
/// first rank); and for the world's ranks, each extra as often as it occurs
/// (the staging once, the buffers once a shard group).
struct HostMemoryNeed {
  int64_t per_rank = 0;                ///< one rank's need
  int64_t reduce_scatter_buffers = 0;  ///< of `host`, the reduce-scatter buffers
  int64_t host = 0;                    ///< this host's ranks together
  int64_t all_ranks = 0;               ///< the world's ranks together
};
/// The need of `run` (see HostMemoryNeed).
HostMemoryNeed host_memory_need(const PlannedRun& run);

/// The preflight: returns host_memory_need when this host's need fits
/// `available` bytes, else throws saying what the run needs, what the host
/// has and what each variant would need.
HostMemoryNeed preflight_host_memory(const PlannedRun& run, int64_t available);


/// The preflight of disk offload's scratch space: this host's ranks' files
/// (NvmeOffloadPlan::file_bytes each, to the byte the files' size) against
/// `free_bytes` in the offload's folder. Returns the bytes they need (0
/// without disk offload); throws naming both where they do not fit, before a
/// rank reserves its file (each rank's own check sees the others' files not
/// yet reserved).
int64_t preflight_scratch_space(const PlannedRun& run, int64_t free_bytes);

}  // namespace fsdp
