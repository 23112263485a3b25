#pragma once
// The engine's own (not installed).
// One unit's parameters as one flat, padded buffer (FSDP1's layout): with a
// shard group of K ranks, rank r keeps elements [r*S, (r+1)*S) as its shard,
// S = ceil(N / K). One all-gather and one reduce-scatter per unit move the
// whole unit.
//
// Why flat rather than per-parameter (FSDP2): the unit's collectives are one
// contiguous buffer with no copy-in/copy-out, and the optimizer sees one leaf
// per unit. Name-keyed state dicts are recovered from the recorded offsets
// (entries()), so nothing user-facing is keyed by flat positions.

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/shard_offload.h"
#include "fsdp/comm.h"
#include "fsdp/options.h"

namespace fsdp {
namespace offload {
class ShardOffload;  // core/shard_offload.h
}
class GatherOrder;  // core/gather_order.h

struct FlatParamEntry {
  std::string name;      // qualified parameter name
  torch::Tensor param;   // the module's parameter (its data is a view while unsharded)
  std::vector<int64_t> shape;
  int64_t offset = 0;    // in the unsharded flat buffer
  int64_t numel = 0;
};

// How one unit is sharded and synchronized (derived from the strategy).
struct FlatParamConfig {
  ProcessGroupPtr shard_group;      // the ranks a unit is split over; null = not split (no_shard)
  ProcessGroupPtr replicate_group;  // the ranks holding the same shard; null = none (no hybrid)
  bool persistent_params = false;   // stay unsharded between steps (no_shard, zero1)
  bool full_gradients = false;      // all-reduce full gradients, keep them (no_shard, zero1)
  MixedPrecision mixed_precision;
  c10::Device device = c10::Device(torch::kCPU);  // where the unit computes (parameters are moved there)
  // Where the shard lives between uses (the model's, shared by its units;
  // not owned): it makes the shard, fetches it for the gather and takes the
  // reduced gradient.
  offload::ShardOffload* offload = nullptr;
  // The model's gather order on a device (not owned; null where gathers
  // wait for the compute stream: the CPU, offload, groups without a gather
  // stream): src/core/gather_order.h.
  GatherOrder* gather_order = nullptr;
  // Its position in detail::flat_params() (the order the placements, the
  // gather order and checkpoints number buffers in), and its name there:
  // its unit's, and "<unit>#frozen" for the unit's frozen parameters.
  size_t index = 0;
  std::string name;
  // The parameters never change (requires_grad false when sharded): the
  // shard is no leaf that requires grad and is not among
  // FsdpState::parameters(), so no optimizer steps, decays or clips it; it
  // gets no gradient buffer and is never reduced. A unit's frozen
  // parameters are a FlatParam of their own (Unit::frozen_params()), so that
  // its trainable one keeps gradients, reductions and optimizer state for
  // trainable elements only.
  bool frozen = false;
  // The dtype the shard is held in: float32, or for a frozen part
  // MixedPrecision::frozen_param_dtype (its mixed_precision's param dtype).
  torch::ScalarType shard_dtype = torch::kFloat;
  // A frozen part of linear weights held in NF4 (MixedPrecision::frozen_nf4,
  // core/nf4.h): each entry starts on a block of 64 elements, the shard is
  // whole 36-byte records (uint8), the gather moves them as bytes and
  // dequantizes them into the param dtype (the unit's compute dtype).
  bool nf4 = false;
  // ZeRO++ (FullyShardOptions::zero_plus_plus; world-sharded strategies):
  // the ranks of this host and one rank of each host (FsdpState::host_group()),
  // and for quantized reductions the world ranks in host-major order
  // (position l * hosts + j: the rank at place l of host j), on the unit's
  // device: the order the host group's reduce-scatter needs its input in.
  ZeroPlusPlus zero_plus_plus;
  ProcessGroupPtr host_group;
  ProcessGroupPtr cross_host_group;
  torch::Tensor host_major_ranks;
};

// What a gradient prepared as it arrived (unit_stepper.h's
// prepare_gradient: disk offload's step before the next gather) left for
// the step's global decisions while its values are out of memory (the
// shard's .grad undefined) until its unit steps.
struct PreparedGradient {
  double sum_of_squares = 0;      // as clip_grad_norm_ sums it (when the step clips)
  bool finite = true;             // no inf or nan after unscaling (when the step unscales)
  double clip_coefficient = 1.0;  // clip_grad_norm_'s scaling, applied when the unit steps
};

class FlatParam {
 public:
  // Takes the parameters' current values (float32, all on one device; every
  // rank must pass the same values) as the initial model. The parameters are left with
  // their full shape in the compute dtype and no meaningful values; call
  // initialize_views() once their gradient accumulators exist.
  FlatParam(std::vector<std::pair<std::string, torch::Tensor>> params, FlatParamConfig config);
  ~FlatParam();  // a buffer still gathered leaves memory::gathered_usage()
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;
  void initialize_views();

  int64_t numel() const { return numel_; }  // real elements
  int64_t padded_numel() const { return shard_numel_ * shard_group_size(); }
  int64_t shard_numel() const { return shard_numel_; }
  int shard_group_size() const { return config_.shard_group ? config_.shard_group->size() : 1; }
  int shard_rank() const { return config_.shard_group ? config_.shard_group->rank() : 0; }
  const FlatParamConfig& config() const { return config_; }
  bool frozen() const { return config_.frozen; }
  // Its position in detail::flat_params(), and its name (FlatParamConfig::index, ::name).
  size_t index() const { return config_.index; }
  const std::string& name() const { return config_.name; }
  // What the model's offload keeps of this unit (core/shard_offload.h), or
  // null before it made any. The placement's, not the parameter's: it may
  // change where the FlatParam is const (a fetch, a ResidentScope).
  offload::UnitOffloadState* offload_state() const { return offload_state_.get(); }
  void set_offload_state(std::unique_ptr<offload::UnitOffloadState> state) const { offload_state_ = std::move(state); }
  // The gradient's figures where it was prepared as it arrived and is kept
  // out of memory (null otherwise): what clipping and loss scaling read
  // instead of the gradient; dropped when TrainStep zeroes the gradients.
  std::optional<PreparedGradient>& prepared_gradient() const { return prepared_gradient_; }
  // TrainStep zeroed the shard's gradient in place since a gradient last
  // landed (a placement that copies each reduced gradient into a buffer of
  // its own may then copy it in instead of adding: CPU offload's).
  bool& gradient_zeroed_in_place() const { return gradient_zeroed_in_place_; }
  // Where the parameters compute (the shard is on the host with cpu_offload).
  c10::Device device() const { return unsharded_.device(); }
  // The local shard: an fp32 leaf that optimizers step (a plain tensor
  // that requires no grad where frozen()). Padding stays zero.
  // NF4 (FlatParamConfig::nf4): the shard is shard_numel() / 64 records of
  // 36 bytes, of nf4_bytes() for the whole unit's real blocks.
  const torch::Tensor& shard() const { return shard_; }
  bool nf4() const { return config_.nf4; }
  int64_t nf4_bytes() const;
  const std::vector<FlatParamEntry>& entries() const { return entries_; }
  bool is_unsharded() const { return is_unsharded_; }

  // The whole unit of a tensor shaped like the shard (the fp32 master, an
  // optimizer moment), padded: collective over the shard group; `local`
  // itself for no_shard. For state dicts: independent of the compute dtype
  // and of whether the unit is unsharded.
  torch::Tensor gather_full(const torch::Tensor& local) const;

  // Makes the parameters views of the full, current values: all-gathers (in
  // the param dtype) unless the buffer already holds the shard's current
  // version (persistent strategies between optimizer steps). Finishes an
  // all-gather start_unshard() issued, or issues one and waits.
  // `exact`: never quantized (ZeroPlusPlus::gather_quantization applies to
  // the training passes' gathers; an UnshardScope's are exact).
  void unshard(bool exact = false);
  // Issues the all-gather (prefetch) without waiting; the parameters stay
  // as they are until unshard(). Nothing if already gathered or issued.
  void start_unshard(bool exact = false);
  // ZeroPlusPlus::secondary_partition: keeps this rank's part of its host's
  // slice of the gathered parameters (before reshard() after forward), which
  // the next gather uses instead of gathering across hosts, unless the
  // shard has changed since; drop_secondary() lets it go.
  void keep_secondary();
  void drop_secondary();
  bool holds_secondary() const { return secondary_.defined(); }
  bool unshard_pending() const { return pending_unshard_ != nullptr; }
  // Frees the unsharded buffer and points the parameters at empty tensors;
  // nothing for persistent strategies.
  void reshard();
  // Copies this rank's part of the unsharded buffer (float32) into the
  // shard: changes made to the whole parameters become the master's.
  void write_back_shard();

  // Flattens the parameters' gradients (zeros where a parameter got none),
  // drops them, and starts the averaging reduction (reduce-scatter, or
  // all-reduce for full gradients). finish_reduce_gradients() waits, reduces
  // across replicas (hybrid), and accumulates into shard().grad().
  void start_reduce_gradients();
  // Before backward computes the unit's gradients: makes each parameter's
  // .grad a view into one flat, zeroed buffer, so autograd accumulates into
  // the buffer the reduction reads (no second full-size copy). Only where
  // that buffer is the reduction's input: sharded gradients, reduce dtype ==
  // param dtype, and no gradients left from micro-steps without sync.
  void prepare_gradient_buffer();
  void drop_gradient_buffer();
  // The offload takes the reduced gradient: CPU offload on a GPU leaves its
  // copy to the host in flight, and finish_host_gradient() waits for it and
  // accumulates it into shard().grad(). Otherwise the gradient is there on return.
  void finish_reduce_gradients();
  bool host_gradient_pending() const;
  void finish_host_gradient();
  // A reduction or its copy to the host is in flight.
  bool reduce_pending() const { return pending_reduce_ != nullptr || host_gradient_pending(); }
  bool collective_reduce_pending() const { return pending_reduce_ != nullptr; }
  // A quantized reduction (ZeroPlusPlus::gradient_quantization) has two
  // collectives: the reduce-scatter inside the host, then the all-to-all
  // across hosts. advance_reduce() waits for the first and issues the
  // second (nothing if the first is done); finish_reduce_gradients() finishes both.
  bool reduce_in_first_stage() const { return pending_reduce_ != nullptr && quantized_reduce_stage_ == 1; }
  void advance_reduce();

 // shard().grad() += gradient (or = it, the first time), in float32: where
  // the offload puts the reduced gradient.
  void accumulate_into_gradient(torch::Tensor gradient);

 private:
  bool shard_aliases_buffer() const;
  void quantize_shard(const torch::Tensor& flat);
  bool quantizes_gathers() const;
  // The parts of start_unshard() and start_reduce_gradients() that ZeRO++ adds.
  void start_quantized_gather(const torch::Tensor& input);
  void start_quantized_reduce(const torch::Tensor& flat_grad);
  torch::Tensor finish_quantized_reduce();

  FlatParamConfig config_;
  std::vector<FlatParamEntry> entries_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  torch::Tensor shard_;
  // Keeps one storage for the unit's whole life, freed and refilled in place,
  // so views that autograd saved during forward see the refilled data in
  // backward (and do not keep the memory alive in between).
  torch::Tensor unsharded_;
  bool is_unsharded_ = false;
  // The buffer holds the shard as of this version, and no optimizer step
  // can have changed it since (a step follows every gradient reduction;
  // optimizers that write through .data() do not bump the version).
  int64_t gathered_version_ = -1;
  bool stale_ = true;
  torch::Tensor full_grad_;        // full_gradients strategies: the reduced gradient (fp32)
  torch::Tensor gradient_buffer_;  // see prepare_gradient_buffer()
  WorkHandle pending_unshard_;
  torch::Tensor pending_unshard_input_;    // the cast shard, alive until the gather ends
  torch::Tensor pending_unshard_staging_;  // what the offload cast it from (CPU offload on a GPU), likewise
  WorkHandle pending_reduce_;
  torch::Tensor pending_result_;
  // ZeRO++: the packed (int8) gather's output, unpacked by unshard(); the
  // secondary partition and the shard version it was taken at; which
  // collective of a quantized reduction is in flight (1 or 2).
  torch::Tensor pending_packed_gather_;
  torch::Tensor secondary_;
  int64_t secondary_version_ = -1;
  int quantized_reduce_stage_ = 0;
  mutable std::unique_ptr<offload::UnitOffloadState> offload_state_;
  mutable std::optional<PreparedGradient> prepared_gradient_;
  mutable bool gradient_zeroed_in_place_ = false;
};

}  // namespace fsdp
