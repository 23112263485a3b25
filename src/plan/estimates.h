#pragma once
// The planner's estimates, one per figure of a run's plan (fsdp/memory_plan.h):
// plan_run puts them together; fsdp-train's strategy choice and fsdp-plan's
// budget call choose_strategy, and the tests check each against what a run
// measures. Internal to the planner library and its programs.

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/memory_plan.h"
#include "fsdp/model_description.h"
#include "fsdp/options.h"

namespace fsdp {

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
///
/// `nf4_numels` (ModelDescription::nf4: each unit's frozen linear weights,
/// each in whole blocks of 64; part of its frozen count): with
/// MixedPrecision::frozen_nf4 they are a buffer of their own, of E elements
/// padded to whole blocks a rank (Ep), held as Ep / 64 * 36 / K bytes a
/// rank (with persistent strategies, and the Ep dequantized elements in the
/// frozen compute dtype), gathered as those records and dequantized beside
/// them; the rest of the frozen count is the frozen part above. Without
/// frozen_nf4 they are ignored.
ModelStateBytes estimate_model_state(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                     int ranks_per_node, const MixedPrecision& mixed_precision,
                                     int64_t optimizer_bytes_per_element = 8,
                                     const std::vector<int64_t>& frozen_numels = {},
                                     const std::vector<int64_t>& nf4_numels = {});

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
                                 const std::vector<int64_t>& frozen_numels = {},
                                 const std::vector<int64_t>& nf4_numels = {});

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
                                                   const std::vector<int64_t>& frozen_numels = {},
                                                   const std::vector<int64_t>& nf4_numels = {});

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
                               const std::vector<int64_t>& frozen_numels = {},
                               const std::vector<int64_t>& nf4_numels = {});

/// See CheckpointStaging; the arguments as estimate_model_state's, and the
/// checkpoint's format (full_format: the full layout, else the sharded one).
CheckpointStaging estimate_checkpoint_staging(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy,
                                              int world, int ranks_per_node, bool full_format,
                                              int64_t optimizer_bytes_per_element = 8,
                                              const std::vector<int64_t>& frozen_numels = {});

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
                            const std::vector<int64_t>& frozen_numels = {},
                            const std::vector<int64_t>& nf4_numels = {});

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
