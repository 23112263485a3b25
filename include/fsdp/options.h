#pragma once
/// \file
/// What fully_shard() can be asked for: the sharding strategy, mixed
/// precision, and the wrap policy.

#include <torch/arg.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/enum_names.h"
#include "fsdp/offload.h"
#include "fsdp/wrap_policy.h"

namespace fsdp {

/// Who keeps what (per rank; W ranks, K ranks per node).
/// Named by enum_name, parsed by parse_enum: "no_shard", "zero1", "shard_grad_op", "full_shard",
/// "hybrid_shard", "hybrid_shard_zero2".
enum class ShardingStrategy {
  kNoShard,      ///< params, grads, optimizer state replicated; one all-reduce of the gradients (DDP)
  kZero1,        ///< params and grads replicated (grads all-reduced), optimizer state sharded;
                 ///< each rank steps its slice and the slices are all-gathered after the step
  kShardGradOp,  ///< ZeRO-2: params sharded at rest, unsharded from forward until after backward;
                 ///< grads and optimizer state sharded
  kFullShard,    ///< ZeRO-3: params gathered on demand, before forward and again before backward
  kHybridShard,  ///< kFullShard inside a node (K ranks), replicated across nodes
  kHybridShardZero2  ///< kShardGradOp inside a node, replicated across nodes
};

namespace detail {
const EnumNames& enum_names(EnumTag<ShardingStrategy>);
}  // namespace detail

/// As PyTorch's MixedPrecision: the optimizer always steps fp32 master
/// shards; param_dtype is what is gathered and computed with (the shard is
/// cast before the all-gather, so bf16 halves the traffic); reduce_dtype is
/// what gradients are reduced in (default: param_dtype). Module buffers
/// (a rotary cache) are cast to param_dtype, as FSDP2 does: it dropped
/// FSDP1's buffer_dtype, which no run here set either.
struct MixedPrecision {
  MixedPrecision() = default;
  /// What gradients are reduced in: reduce_dtype, else param_dtype.
  torch::ScalarType effective_reduce_dtype() const { return reduce_dtype_.value_or(param_dtype_); }
  /// What frozen parameters are gathered and computed in: frozen_param_dtype, else param_dtype.
  torch::ScalarType effective_frozen_param_dtype() const { return frozen_param_dtype_.value_or(param_dtype_); }

  /// What parameters are gathered and computed in (fp32 by default).
  TORCH_ARG(torch::ScalarType, param_dtype) = torch::kFloat;
  /// What gradients are reduced in (unset: param_dtype).
  TORCH_ARG(std::optional<torch::ScalarType>, reduce_dtype) = std::nullopt;
  /// The dtype frozen parameters (requires_grad false) are held, gathered and
  /// computed in, apart from the others: kBFloat16 halves a LoRA base's
  /// memory and its gathers while the adapters keep fp32 masters and
  /// optimizer state (fsdp-train --base-dtype bf16). Their values are rounded
  /// to it once, when sharded; state dicts and checkpoints hold them in fp32
  /// (exactly those values). Unset: as the other parameters (fp32 shards,
  /// gathered in param_dtype). Not with an offload or quantized gathers.
  TORCH_ARG(std::optional<torch::ScalarType>, frozen_param_dtype) = std::nullopt;
  /// QLoRA's base: the frozen weights of linear layers (torch::nn::Linear's
  /// `weight`, but those of nf4_skip_modules) held in NF4, bitsandbytes'
  /// 4-bit format byte for byte (blocks of 64 with an fp32 absmax: 0.5625
  /// bytes a parameter). A unit's NF4 weights are a buffer of their own,
  /// sharded as bytes on block boundaries, all-gathered as bytes and
  /// dequantized into effective_frozen_param_dtype() just before the unit
  /// computes (fsdp-train --base-dtype nf4). The other frozen parameters
  /// stay as frozen_param_dtype says. Not with an offload or quantized gathers.
  TORCH_ARG(bool, frozen_nf4) = false;
  /// Linear layers frozen_nf4 leaves unquantized: a module named so, or
  /// whose name ends in "." and one of these (transformers'
  /// llm_int8_skip_modules; it keeps the output layer too).
  TORCH_ARG(std::vector<std::string>, nf4_skip_modules) = std::vector<std::string>{"lm_head"};
};

// The dtypes' names (fsdp/enum_names.h lists them).
namespace detail {
const EnumNames& enum_names(EnumTag<torch::ScalarType>);
}  // namespace detail

/// When backward issues the next unit's all-gather (PyTorch's BackwardPrefetch).
/// Named by enum_name, parsed by parse_enum: "none", "pre", "post".
enum class BackwardPrefetch {
  kNone,  ///< when the unit's own backward starts
  kPre,   ///< at this unit's pre-backward, before its gradients are computed
          ///< (most overlap; one more unit's parameters held meanwhile)
  kPost   ///< at this unit's post-backward, after its gradients are computed
          ///< and before their reduce-scatter
};
namespace detail {
const EnumNames& enum_names(EnumTag<BackwardPrefetch>);  ///< "none", "pre", "post"
}  // namespace detail

/// Offload to disk (DeepSpeed's ZeRO-Infinity), for model state larger than
/// memory: each rank's offloaded state lives in one scratch file in
/// store().dir() between uses, read back asynchronously when it is needed
/// (what is offloaded: optimizer_state() and params()).
/// Gradient shards leave memory as they arrive (step_in_backward). The optimizer must be an fsdp::FusedAdamW,
/// and the model trains through fsdp::TrainStep, whose step brings each
/// unit's state in around its update: a plain loss.backward() is refused.
/// Results are bitwise those of the same run in memory, and checkpoints hold
/// the offloaded state as if it had never left (scratch files are never
/// checkpoints: they are removed when the model is destroyed).
struct NvmeOffloadOptions {
  /// Offload into a scratch file in `dir` (it must exist).
  explicit NvmeOffloadOptions(std::string dir) : store_(std::move(dir)) {}
  /// The AdamW moments, and the fp32 master shards when the parameters
  /// compute in another dtype (a copy in the param dtype stays in memory for
  /// the all-gathers); read, stepped and written back unit by unit (see
  /// step_in_backward). On by default.
  TORCH_ARG(bool, optimizer_state) = true;
  /// The parameter shards (in the param dtype), read before their unit's
  /// all-gather; sharded strategies only. Off by default.
  TORCH_ARG(bool, params) = false;
  /// Step each unit's optimizer during the last backward of a
  /// fsdp::TrainStep, as soon as its gradient is reduced: its state is read
  /// while the unit's backward computes, its gradient is freed at once and
  /// its state is written behind the next units' backward. No gradient
  /// shard stays in memory until the step, and the optimizer's disk traffic
  /// overlaps compute. A step that clips the gradient norm or scales the
  /// loss needs every gradient before any unit steps: each gradient is
  /// then unscaled and its sum of squares taken as it arrives, it is
  /// written to the scratch file and freed, and each unit's update waits,
  /// with the step's clip coefficient and learning rate, until the unit is
  /// next needed (its next forward's all-gather, or a checkpoint), its
  /// state and gradient read ahead in gather order. false: the step runs
  /// after backward, unit by unit, with every gradient in memory until
  /// then. The same numbers, bit for bit, either way. On by default.
  TORCH_ARG(bool, step_in_backward) = true;
  /// Room in the scratch file for each unit's gradient (4 bytes a
  /// parameter): what a step that clips the gradient norm or scales the
  /// loss writes out as it arrives (step_in_backward). false: such a step
  /// runs after backward instead, its gradients in memory until then; a
  /// step that does neither needs no room for them (fsdp-train reserves it
  /// only for a run that clips or scales the loss). On by default.
  TORCH_ARG(bool, gradient_slots) = true;
  /// Parameter shards read ahead of their all-gather, in the order the units
  /// were gathered in the last step (each costs one unit's shard of memory
  /// while it waits): deep enough to hide the disk where its bandwidth
  /// allows it. At least 1. The depth the first steps read at (see max_read_ahead).
  TORCH_ARG(int, read_ahead) = 2;
  /// The deepest the read-ahead may grow (0: read_ahead, fixed). After each
  /// step from the second on (the first has no order to read ahead in) in
  /// which compute waited on the disk for at least deepen_above of the
  /// step's time, this rank reads one unit deeper, up to this. Each unit
  /// deeper holds one more unit's shards (and, stepping before the next
  /// gather, its state and gradient) while they wait: the memory planner's
  /// figures at this depth are the bound (fsdp-train's preflight picks the
  /// deepest that fits the host). The numbers are the same at any depth.
  TORCH_ARG(int, max_read_ahead) = 0;
  /// The share of a step compute may wait on the disk before the read-ahead
  /// deepens (0: after every step, up to max_read_ahead). The trainer keeps
  /// the default; 0 makes the deepening happen on a fast disk too, which is
  /// how the tests check that every depth gives the same numbers.
  TORCH_ARG(double, deepen_above) = 0.02;
  /// Where and how (the scratch file's name is set per rank).
  TORCH_ARG(offload::DiskStoreOptions, store);
};

/// Where a model's sharded state lives between uses: one placement a model,
/// as FSDP2's one offload_policy. The default keeps it where the units
/// compute; cpu() and nvme() move it out (fsdp-train: --offload,
/// --offload-optimizer and --offload-params choose it).
class OffloadPolicy {
 public:
  /// No offload: the shards live where the units compute.
  OffloadPolicy() = default;
  /// CPU offload (PyTorch's CPUOffload(offload_params=True), FSDP2's
  /// CPUOffloadPolicy): the fp32 shards, their gradients and so the optimizer
  /// state live in host memory (pinned for a GPU model), and the optimizer
  /// steps there (fsdp::FusedAdamW is the fast one); the device holds only
  /// the parameters being gathered and the gradients being reduced. Sharded
  /// strategies only.
  static OffloadPolicy cpu();
  /// Offload to disk (see NvmeOffloadOptions); CPU units only.
  static OffloadPolicy nvme(NvmeOffloadOptions options);

  /// Whether the shards live in host memory (cpu()).
  bool is_cpu() const { return cpu_; }
  /// The disk offload's options (nvme()); empty for the other placements.
  const std::optional<NvmeOffloadOptions>& nvme_options() const { return nvme_; }

 private:
  bool cpu_ = false;
  std::optional<NvmeOffloadOptions> nvme_;
};

/// How a collective's payload is quantized (ZeRO++'s qwZ and qgZ).
/// Named by enum_name, parsed by parse_enum: "none", "int8".
enum class Quantization {
  kNone,  ///< not quantized: the payload travels in its own dtype
  kInt8   ///< int8 in blocks of ZeroPlusPlus::quantization_block elements, one fp32 scale per block
};
namespace detail {
const EnumNames& enum_names(EnumTag<Quantization>);  ///< "none", "int8"
}  // namespace detail

/// ZeRO++'s three ways to cut the traffic between hosts (DeepSpeed's
/// zero_quantized_weights, zero_hpz_partition_size and
/// zero_quantized_gradients), for the world-sharded strategies. A host is
/// FullyShardOptions::ranks_per_node ranks (0: the ranks that share memory,
/// as MPI reports them); every host must have as many. Each option is
/// refused, with the reason, where it cannot help: see the setters.
struct ZeroPlusPlus {
  ZeroPlusPlus() = default;
  /// Whether any of the three is on.
  bool any() const {
    return gather_quantization_ != Quantization::kNone || secondary_partition_ ||
           gradient_quantization_ != Quantization::kNone;
  }
  /// qwZ: each rank quantizes its parameter shard (in the param dtype) to
  /// int8 in blocks before the all-gather, and the gathered blocks are
  /// dequantized into the param dtype: a quarter of fp32's bytes. The fp32
  /// masters and the optimizer are untouched; the same shard always
  /// quantizes to the same bytes. Sharded strategies; gathers for state
  /// dicts and inside an fsdp::UnshardScope stay exact.
  TORCH_ARG(Quantization, gather_quantization) = Quantization::kNone;
  /// hpZ (FSDP2's reshard_after_forward set to the ranks per node): after a unit's
  /// forward, each rank keeps its host's slice of the gathered parameters
  /// (1/ranks_per_node of the unit, in the param dtype), so that backward's
  /// all-gather stays inside the host. Costs that slice of every unit from
  /// forward to backward (memory::Category::kSecondaryPartition).
  /// full_shard only: shard_grad_op and the hybrids gather nothing across
  /// hosts in backward.
  TORCH_ARG(bool, secondary_partition) = false;
  /// qgZ: gradients are reduced in two steps, first reduce-scattered inside
  /// the host (in the reduce dtype), then each rank's part is quantized and
  /// exchanged with one rank per other host (an all-to-all), where it is
  /// dequantized and summed in fp32. full_shard and shard_grad_op (the
  /// hybrids already reduce inside the host).
  TORCH_ARG(Quantization, gradient_quantization) = Quantization::kNone;
  /// Elements per quantization block (each has its own fp32 scale): the
  /// error of an element is at most its block's largest magnitude / 254, so
  /// a block that spans a LayerNorm's weights (about 1) and a weight matrix
  /// (about 0.02) rounds the matrix coarsely. 64 by default: the scales add
  /// 6.25 % to the int8 payload (a gather moves 0.27x fp32's bytes), and the
  /// small preset trains as with fp32 gathers, where blocks of 256 and 512
  /// doubled one step's loss (docs/zero-plus-plus.md).
  TORCH_ARG(int64_t, quantization_block) = 64;
};

/// Gives parameter `name` its initial values, in place
/// (FullyShardOptions::param_init_fn).
using ParamInitFn = std::function<void(const std::string& name, torch::Tensor& param)>;

/// What fully_shard() is asked for; every setter returns the options, to chain:
/// `FullyShardOptions().strategy(ShardingStrategy::kShardGradOp).forward_prefetch(true)`.
struct FullyShardOptions {
  FullyShardOptions() = default;
  /// Which submodules become units; without one, the whole model is one unit.
  TORCH_ARG(WrapPolicy, wrap_policy) = nullptr;
  /// Who keeps what (kFullShard, ZeRO-3, by default).
  TORCH_ARG(ShardingStrategy, strategy) = ShardingStrategy::kFullShard;
  /// The dtypes gathered, computed and reduced in (fp32 throughout by default).
  TORCH_ARG(MixedPrecision, mixed_precision) = MixedPrecision();
  /// Hybrid strategies: ranks per node (the shard group). 0 = the ranks that
  /// share memory with this one, as MPI reports them.
  TORCH_ARG(int, ranks_per_node) = 0;
  /// Prefetch: issue the all-gather of the unit that runs next (in the order
  /// the units ran in the previous pass) before waiting on this one's, so
  /// the transfer overlaps compute. Forward: off by default (as PyTorch).
  TORCH_ARG(bool, forward_prefetch) = false;
  /// Backward's prefetch: when it issues the next unit's all-gather
  /// (BackwardPrefetch; kPre by default, as PyTorch).
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::kPre;
  /// How many units ahead prefetch gathers.
  TORCH_ARG(int, prefetch_depth) = 1;
  /// The all-gather limiter: at most one prefetched unit waits unused at a
  /// time (two units unsharded by the pipeline: the computing one and the
  /// next), whatever prefetch_depth says, so prefetch never raises the peak
  /// by more than one unit. A prefetch over the limit is issued when a unit
  /// frees its parameters.
  TORCH_ARG(bool, limit_all_gathers) = true;
  /// Activation checkpointing of every unit but the root: its forward keeps
  /// no activations (only its input), and backward recomputes it with the
  /// parameters it has just gathered (no second gather), the CPU RNG state
  /// restored. The unit's forward must take one tensor first and return one
  /// (arguments after it are copied for the recompute as they are: a
  /// SequencePacking, flags; a tensor, an optional or a list of tensors,
  /// whose gradient the copy would lose, is refused), and the unit must
  /// contain no other unit.
  TORCH_ARG(bool, activation_checkpointing) = false;
  /// Sharded initialization: called for every parameter, in
  /// named_parameters() order (tied ones once), to give it its initial
  /// values; parameters created under memory::DeferredInit get real memory
  /// first. Each unit is sharded as soon as its last parameter is
  /// initialized, so the full model never exists on any rank. Every rank
  /// must produce the same values (seed the RNG alike before fully_shard).
  TORCH_ARG(ParamInitFn, param_init_fn) = nullptr;
  /// Where the units' shards live between uses (OffloadPolicy): beside the
  /// compute by default, in host memory, or on disk.
  TORCH_ARG(OffloadPolicy, offload);
  /// The device the units compute on (FSDP1's device_id): parameters and
  /// buffers are moved there as their unit is sharded, and parameters under
  /// memory::DeferredInit are materialized there, so a model built on the CPU
  /// never exists whole on the GPU. Unset: where the parameters are (all on
  /// one device).
  TORCH_ARG(std::optional<c10::Device>, device) = std::nullopt;
  /// Keep freed host buffers for reuse (memory::set_block_cache_limit): with
  /// the counting allocator installed and the units on the CPU, fully_shard
  /// raises the cache's limit to six of the largest unit's fp32 buffers (the
  /// gathered parameters, gradient buffers and reduction outputs of the units
  /// in flight; on `large` six measured 6 % faster than three, twelve no
  /// faster), so each re-gather reuses a buffer instead of faulting in fresh
  /// pages. The cached bytes are reserved, not live: peak RSS did not grow.
  /// Three buffers with disk offload. The
  /// limit is the process's: fully_shard only ever raises it, and
  /// memory::set_block_cache_limit / empty_block_cache lower or empty it.
  TORCH_ARG(bool, cache_host_blocks) = true;
  /// ZeRO++'s quantized and hierarchical collectives (all off by default).
  TORCH_ARG(ZeroPlusPlus, zero_plus_plus) = ZeroPlusPlus();
};

}  // namespace fsdp
