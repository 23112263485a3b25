#pragma once
/// \file
/// What each strategy keeps per rank, computed from the units' sizes alone:
/// the figures a run measures with the counting allocator, to the byte.

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/model_description.h"
#include "fsdp/options.h"

namespace fsdp {

/// The model state a strategy keeps per rank, in bytes (estimate_model_state).
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

/// The shard group size of a strategy: 1 (no_shard), the world (zero1,
/// shard_grad_op, full_shard) or the ranks per node (hybrid).
int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node);

/// Per rank, at rest between steps, for units of the given element counts
/// (the root unit first, as plan_units lists them); optimizer_bytes_per_element
/// is 8 for Adam (two fp32 moments).
/// \code{.unparsed}
///   every unit of N elements is padded to Np = ceil(N / K) * K, S = Np / K;
///   no_shard:  params 4N (+ p N low-precision copy), grads 4N, optimizer 8N
///   zero1:     params 4Np (fp32) or p Np + 4S, grads 4Np, optimizer 8S
///   others:    params 4S, grads 4S, optimizer 8S
/// \endcode
/// (p = bytes of the param dtype; the fp32 master shard is always kept).
///
/// `frozen_numels` (empty: nothing frozen; else one count per unit, 0 for a
/// unit that freezes nothing): the elements of each unit's frozen part, the
/// separate flat buffer fully_shard makes of a unit's parameters that require
/// no gradient (docs/fine-tuning.md). A frozen part of F elements is padded
/// on its own (Fp = ceil(F / K) * K) and has the params above for F, no
/// gradient and no optimizer state; it is gathered with its unit, so a
/// gathered unit holds Np + Fp elements. The trainable counts in
/// `unit_numels` are then the rest of each unit (0 for one wholly frozen).
ModelStateBytes estimate_model_state(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                     int ranks_per_node, const MixedPrecision& mixed_precision,
                                     int64_t optimizer_bytes_per_element = 8,
                                     const std::vector<int64_t>& frozen_numels = {});

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
/// The bytes one step moves per rank, by collective kind (see CommBytes);
/// the arguments as estimate_model_state's, and the ZeRO++ options the units
/// were sharded with. Hosts: H = world / ranks_per_node (one host for 0), of
/// K ranks each. Per unit of N elements, with the shard S = ceil(N / G) over
/// the shard group G (the world, or K for the hybrids), Np = S G, p and r
/// the bytes of the param and reduce dtypes, B = quantization_block and
/// PB(S) = ceil(S / B) (B + 4) (the int8 blocks, one fp32 scale each):
/// \code{.unparsed}
///   a gather           Np p, or G PB(S) bytes with gather_quantization
///   full_shard         two gathers; with secondary_partition backward's is
///                      Np p over the host (never quantized)
///   shard_grad_op      one gather
///   reduction          reduce_scatter Np r; with gradient_quantization a
///                      reduce_scatter of Np r over the host and an
///                      all_to_all of H PB(S) over one rank per host
///   hybrids            + all_reduce S r across hosts (H > 1)
///   cross_host         (H > 1) the world group's collectives, the hybrids'
///                      all_reduce and the all_to_all; the host group's
///                      (hpZ's gathers, qgZ's first step, the hybrids'
///                      gathers and reduce-scatters) stay inside
/// \endcode
/// A frozen part (`frozen_numels`, as estimate_model_state's) is gathered
/// as its unit is, and reduces nothing: with no_shard and zero1 it moves no
/// bytes in a step (its parameters never change, so zero1 never gathers them
/// again).
/// Throws, with fully_shard's reasons, for the combinations it refuses
/// (check_zero_plus_plus_plan).
CommBytes estimate_comm_per_step(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                 int ranks_per_node, const MixedPrecision& mixed_precision,
                                 const ZeroPlusPlus& zero_plus_plus = ZeroPlusPlus(),
                                 const std::vector<int64_t>& frozen_numels = {});
/// Throws, with the reason fully_shard gives, where ZeRO++'s options cannot
/// be used with `strategy` (no_shard and zero1; secondary_partition except
/// with full_shard; gradient_quantization with the hybrids; a block that is
/// not a positive multiple of 4), or where ranks_per_node does not divide
/// the world.
void check_zero_plus_plus_plan(ShardingStrategy strategy, int world, int ranks_per_node,
                               const ZeroPlusPlus& zero_plus_plus);

/// Choosing a strategy for a per-rank memory budget: the one rule that
/// `fsdp-train --strategy auto --memory-budget` and `fsdp-plan --budget` share.
///
/// The budget covers the per-rank model state (parameters, gradients and
/// AdamW state, as estimate_model_state counts them) plus the parameters the
/// strategy holds gathered at its peak (gathered_peak: every unit for
/// shard_grad_op, the root and the largest other unit for full_shard). These
/// are exact for any model from its units' sizes alone; activations and
/// backward's transient buffers depend on the batch and come on top (see
/// estimate_step_peak).
///
/// Candidates are tried from least to most communication, and the first that
/// fits is chosen: no_shard (one all-reduce of the gradients), zero1 (the
/// all-reduce and an all-gather of the updated parameters), shard_grad_op
/// (an all-gather and a reduce-scatter per unit), full_shard (a second
/// all-gather in backward). Over several nodes (0 < ranks_per_node < world)
/// each hybrid variant comes before its world-sharded counterpart, since its
/// gathers and reductions stay inside a node and only the shard crosses
/// nodes: no_shard, zero1, hybrid_shard_zero2, shard_grad_op, hybrid_shard,
/// full_shard.
struct StrategyCandidate {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  ///< the strategy tried
  ModelStateBytes state;  ///< its model state and gathered peak per rank
  CommBytes comm;         ///< its bytes per step per rank
  /// What the budget is compared with: state.total_with_gathered().
  int64_t needed() const { return state.total_with_gathered(); }
};

/// Every candidate for the world and nodes, in the order tried, with its
/// figures (`frozen_numels`: the units' frozen parts, as estimate_model_state's).
std::vector<StrategyCandidate> strategy_candidates(const std::vector<int64_t>& unit_numels, int world,
                                                   int ranks_per_node, const MixedPrecision& mixed_precision,
                                                   const std::vector<int64_t>& frozen_numels = {});

/// What choose_strategy() chose, and why.
struct StrategyChoice {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  ///< the first candidate that fits
  int64_t budget = 0;  ///< the budget it was chosen for (bytes per rank)
  std::vector<StrategyCandidate> candidates;  ///< all of them, in the order tried
  /// One line for people, the same wherever it is printed: the choice, the
  /// rule, and every candidate's need.
  std::string reason;
};

/// The first candidate whose needed() is at most `budget` bytes; throws
/// naming the budget and every candidate's need when none fits.
StrategyChoice choose_strategy(const std::vector<int64_t>& unit_numels, int world, int ranks_per_node,
                               const MixedPrecision& mixed_precision, int64_t budget,
                               const std::vector<int64_t>& frozen_numels = {});


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
/// See CheckpointStaging; the arguments as estimate_model_state's, and the
/// checkpoint's format (full_format: the full layout, else the sharded one).
CheckpointStaging estimate_checkpoint_staging(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy,
                                              int world, int ranks_per_node, bool full_format,
                                              int64_t optimizer_bytes_per_element = 8,
                                              const std::vector<int64_t>& frozen_numels = {});

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
/// `unit_numels` overrides shape.unit_numels() (a model of another
/// parameter count with the same block structure; the blocks equal).
/// `zero_plus_plus`: hpZ's slices (secondary_partition), and with
/// gather_quantization a quantized gather's packed buffers in `gathered`
/// (the packed shard and the K packed rows of the largest unit).
/// `frozen_numels`: the units' frozen parts (estimate_model_state's),
/// gathered with their units (and kept, and prefetched, with them); backward's
/// gradient buffers are the trainable parts' alone. The activations are the
/// whole model's: an overestimate where autograd keeps less, the input of a
/// frozen linear without an adapter (LoRA on the tiny GPT's c_attn and c_proj
/// alone, its c_fc frozen: the peak 8% over the measured, where adapting
/// every linear is 4.4% over) or a frozen prefix's activations.
StepPeak estimate_step_peak(const TransformerShape& shape, ShardingStrategy strategy, int world, int ranks_per_node,
                            const MixedPrecision& mixed_precision, bool prefetch, bool activation_checkpointing,
                            const std::vector<int64_t>& unit_numels = {},
                            const ZeroPlusPlus& zero_plus_plus = ZeroPlusPlus(),
                            const std::vector<int64_t>& frozen_numels = {});

/// Disk offload (FullyShardOptions::nvme_offload), per rank: what leaves
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
/// state (read, step, write); stepping in backward (NvmeStepSchedule::kInBackward)
/// holds read_ahead + 1 (stepping, read ahead; what is written behind frees as it goes) and the
/// stepping unit's gradient during backward, and no gradient shard stays;
/// stepping before the next gather (NvmeStepSchedule::kBeforeNextGather) holds
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
/// `micro_steps`: gradient accumulation gathers (and so reads) the parameters
/// in every micro-step. `step_in_backward`: nvme_step_schedule's answer
/// for the run; `read_ahead`: NvmeOffloadOptions::read_ahead;
/// `gradient_slots`: NvmeOffloadOptions::gradient_slots (the scratch file
/// holds a gradient per unit where the step overlaps backward and it is set).
/// `frozen_numels`: each unit's frozen part, as estimate_model_state takes
/// them: on disk with the parameters, read by the gathers, never stepped.
NvmeOffloadPlan estimate_nvme_offload(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                      int ranks_per_node, const MixedPrecision& mixed_precision, bool optimizer_state,
                                      bool params, int64_t micro_steps = 1, int64_t block_bytes = int64_t{1} << 20,
                                      bool step_in_backward = false, int read_ahead = 2,
                                      bool step_before_next_gather = false, bool gradient_slots = true,
                                      const std::vector<int64_t>& frozen_numels = {});
/// The step's peak of host memory with disk offload: the in-memory peak less
/// what is offloaded, plus the gather's buffers, and the step's: during
/// backward when the units step there; before the next gather, the larger
/// of forward with the stepping units' state and backward with the
/// gradients being written out; else after backward (which has freed the
/// activations by then).
int64_t peak_with_nvme_offload(const StepPeak& peak, const NvmeOffloadPlan& plan);

}  // namespace fsdp
