#pragma once
/// \file
/// The figures of a run's plan (run_plan.h's RunPlan): what each strategy
/// keeps per rank, moves per step, stages for a checkpoint and puts on disk,
/// computed from the units' sizes alone: the figures a run measures with the
/// counting allocator, to the byte. The planner library (fsdp::fsdp_plan)
/// computes them in plan_run; its estimates are its own (src/plan/estimates.h).

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/model_description.h"
#include "fsdp/options.h"

namespace fsdp {

/// The model state a strategy keeps per rank, in bytes (RunPlan::peak.state).
struct ModelStateBytes {
  int64_t params = 0;     ///< parameter shards (replicated strategies: the full copies)
  /// Of `params`, the frozen parts' (fine-tuning: the parameters that train
  /// not): their only bytes, since they have no gradient and no optimizer state.
  int64_t frozen_params = 0;
  int64_t grads = 0;      ///< gradient shards (no_shard, zero1: the full reduced gradient)
  int64_t optimizer = 0;  ///< optimizer state
  /// The most gathered (unsharded) parameters held at once during a step, on
  /// top of the above: every unit for shard_grad_op (kept from forward to
  /// backward), the root and one other unit for full_shard (no prefetch),
  /// nothing for no_shard and zero1 (already counted in params).
  int64_t gathered_peak = 0;
  /// params + grads + optimizer: the state at rest.
  int64_t total() const { return params + grads + optimizer; }
  /// total() + gathered_peak: what a memory budget is compared with.
  int64_t total_with_gathered() const { return total() + gathered_peak; }
};

/// Bytes each collective kind moves per rank in one step (as the
/// communicator counts them: a gather's full output, a reduction's full
/// input, an all-to-all's input), for units of the given element counts.
struct CommBytes {
  int64_t all_gather = 0;      ///< parameters gathered (twice a step where resharded after forward)
  int64_t reduce_scatter = 0;  ///< gradients reduced into shards
  int64_t all_reduce = 0;      ///< gradients reduced whole (no_shard, zero1), or across nodes (hybrid)
  int64_t all_to_all = 0;      ///< quantized gradients exchanged across hosts (ZeroPlusPlus::gradient_quantization)
  /// Of the above, the bytes of collectives over groups that span hosts (as
  /// FsdpState::cross_host_comm_stats() counts them); 0 on one host.
  int64_t cross_host = 0;
  /// Bytes over every kind.
  int64_t total() const { return all_gather + reduce_scatter + all_reduce + all_to_all; }
  /// The bytes that stay inside a host: total() - cross_host.
  int64_t inside_host() const { return total() - cross_host; }
};

/// Asynchronous checkpoints (CheckpointManagerOptions::async): the host
/// memory a save's staging copy holds from the save until its background
/// write ends (the following steps run beside it; the sharded format's
/// buffers stay from the first save on, reused by the next), per rank, for units of
/// the given element counts (o = optimizer_bytes_per_element, 8 for Adam;
/// S = ceil(N / G), the shard over the shard group G):
/// \code{.unparsed}
///   sharded  every rank that writes a shard (the first replica's ranks;
///            no_shard: rank 0 alone): (4 + o) S per unit
///   full     rank 0 alone, the whole model gathered: (4 + o) Np per unit
///            (Np = S G, the padded unit), the other ranks nothing
/// \endcode
/// A frozen part (`frozen_numels`) is saved too, without optimizer state:
/// 4 bytes where a trainable element has 4 + o.
struct CheckpointStaging {
  int64_t per_rank = 0;  ///< the most any rank but rank 0 stages
  int64_t rank0 = 0;     ///< what rank 0 stages
  /// The most any rank stages.
  int64_t most() const { return rank0 > per_rank ? rank0 : per_rank; }
};

/// The peak tensor bytes of one training step, per rank, by category: the
/// model state at rest, the gathered parameters, the activations autograd
/// keeps (all of them at the start of backward), and what backward adds on
/// top at its peak: the loss's gradients at its start (2 M V fp32 whole, one slice and the head's V C sliced), or a
/// unit's gradient buffers once its own activations are freed. Within a few
/// percent of what the counting allocator measures for the presets (tests/trainer/cases/planner.sh).
struct StepPeak {
  ModelStateBytes state;           ///< the model state at rest
  int64_t gathered = 0;            ///< the gathered parameters held at the peak
  int64_t activations = 0;         ///< what autograd keeps, all of it at the start of backward
  int64_t backward_transient = 0;  ///< what backward adds at its peak
  /// ZeroPlusPlus::secondary_partition (memory::Category::kSecondaryPartition):
  /// every unit's host slice, Np / K elements in the param dtype (K ranks a
  /// host), all held at once from the end of forward into backward.
  int64_t secondary_partition = 0;
  /// The step's peak: the sum of the above.
  int64_t total() const { return state.total() + gathered + activations + backward_transient + secondary_partition; }
};

/// Disk offload (OffloadPolicy::nvme), per rank: what leaves
/// memory, what the scratch file holds, and one step's disk traffic, from the
/// units' sizes alone (S = a unit's shard, p = the param dtype's bytes):
/// \code{.unparsed}
///   optimizer_state  moments 8S on disk; with p < 4 also the master 4S, a pS
///                    copy staying for the gathers
///   params           fp32: the master 4S on disk; otherwise the pS copy
///   per step         optimizer state: read and written once (the step);
///                    parameters: read at every gather (two a micro-step for
///                    full_shard and hybrid_shard, one for the zero2 kinds),
///                    written once (after the step); stepping in backward
///                    with fp32 parameters, the last backward gather's read
///                    of the master is the step's
///   gradients        stepping before the next gather (a clipped or
///                    loss-scaled step that overlaps compute): 4S on disk,
///                    written once and read once a step; the update's
///                    master is what the next forward gathers (no read of
///                    its own)
/// \endcode
/// A gather holds 1 + read_ahead units' parameters (the one gathered, those
/// read ahead). The step after backward holds up to three units' offloaded
/// state (read, step, write); stepping in backward (NvmeOffloadOptions::step_in_backward)
/// holds read_ahead + 1 (stepping, read ahead; what is written behind frees as it goes) and the
/// stepping unit's gradient during backward, and no gradient shard stays;
/// stepping before the next gather (a clipped or loss-scaled step with gradient slots) holds
/// read_ahead units' state with their gradients during forward, and two
/// gradients being written out during backward: transient bytes on top of
/// what stays. (Measured against runs: xl and medium at W = 4, fp32, both
/// offloads, activation checkpointing, clipped: the tensor peak planned
/// within 0.5 %.)
struct NvmeOffloadPlan {
  ModelStateBytes resident;        ///< the model state that stays in memory between steps
  int64_t offloaded = 0;           ///< the model state on disk (the slots' bytes)
  int64_t file_bytes = 0;          ///< the scratch file: each slot rounded up to whole blocks
  int64_t step_buffers = 0;        ///< in memory at the optimizer step's peak, on top of `resident`
  int64_t gather_buffers = 0;      ///< in memory at a gather's peak (offloaded parameters), on top
  int64_t gradient_buffers = 0;    ///< stepping before the next gather: gradients being written out, at backward's peak
  bool step_in_backward = false;   ///< the units step during backward: step_buffers add to backward's peak
  /// The units step before their next gather (their gradients written out
  /// in backward): step_buffers add to forward's peak.
  bool step_before_next_gather = false;
  /// Bytes one step reads from and writes to the scratch file.
  ///@{
  int64_t read_per_step = 0, written_per_step = 0;
  ///@}
  /// Bytes read and written in one step.
  int64_t io_per_step() const { return read_per_step + written_per_step; }
  /// Seconds of disk I/O a step needs at these bandwidths (bytes/s), not
  /// counting what overlaps compute.
  double io_seconds(double read_bandwidth, double write_bandwidth) const;
};

}  // namespace fsdp
