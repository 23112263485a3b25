#pragma once
/// \file
/// TrainStep: one optimizer step of a sharded model.
///
/// One optimizer step of a sharded model, as every training loop needs it:
/// gradient accumulation (with no_sync where it is free, or asked for), the
/// global-batch mean loss, loss scaling when a dtype is fp16, clipping by the
/// global norm, skipping a step on overflow on every rank alike, zero_grad,
/// and the step's figures. A user's loop:
///
/// \code{.cpp}
/// auto model = fsdp::fully_shard(Net(), mpi.world(), options);
/// torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-3));
/// fsdp::TrainStep train_step(model, optimizer, fsdp::TrainStepOptions().micro_steps(4).clip_grad_norm(1.0));
/// for (int64_t step = 0; step < steps; ++step) {
///   fsdp::StepResult r = train_step([&](int64_t micro) {
///     auto [x, y] = next_batch(step, micro);
///     return model(x, y);                // this rank's mean loss of one micro-batch
///   });
///   if (rank == 0) std::cout << step << " " << r.loss << "\n";
/// }
/// \endcode

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/memory.h"

namespace fsdp {

/// What TrainStep does around the optimizer step; setters chain, as in fsdp/train_step.h's example.
struct TrainStepOptions {
  TrainStepOptions() = default;
  /// Gradient accumulation: the loss function is called this many times per
  /// step, and the gradient is that of the mean of the micro-steps' losses.
  TORCH_ARG(int64_t, micro_steps) = 1;
  /// Skip the gradient reduction on all but the last micro-step also for
  /// strategies with sharded gradients (PyTorch's no_sync): less
  /// communication, full-size gradients kept between micro-steps. Strategies
  /// that keep full gradients (no_shard, zero1) always skip it; it costs
  /// them nothing.
  TORCH_ARG(bool, no_sync) = false;
  /// Clip the gradient to this global 2-norm (over all shards and ranks);
  /// 0 = no clipping.
  TORCH_ARG(double, clip_grad_norm) = 0.0;
  /// Decoupled (AdamW's) weight decay of the parameters of 2 or more
  /// dimensions only (not biases and norm gains), at each parameter group's
  /// current lr, as torch AdamW with a second parameter group at 0. Applied only to steps taken (not
  /// to one skipped on overflow). The optimizer's own weight_decay must then
  /// be 0 (AdamWOptions defaults to 0.01): it would decay every tensor.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Dynamic loss scaling: on by default exactly when the param or reduce
  /// dtype is fp16 (bf16 and fp32 need none).
  TORCH_ARG(std::optional<bool>, loss_scaling) = std::nullopt;
  /// The loss scaler's schedule, when loss scaling is on.
  TORCH_ARG(GradScalerOptions, grad_scaler) = GradScalerOptions();
  /// Gather every rank's memory figures to every rank after each step (one
  /// small all-gather): StepResult::per_rank.
  TORCH_ARG(bool, gather_rank_figures) = true;
};

/// One rank's memory at the end of a step, from the counting allocator (zeros
/// if it is not installed).
struct RankFigures {
  int64_t model_state_bytes = 0;   ///< parameter shards + gradient shards + optimizer state
  int64_t peak_tensor_bytes = 0;   ///< the step's peak of all tensor bytes
  int64_t param_shard_bytes = 0;      ///< model_state_bytes' parameter shards
  int64_t grad_shard_bytes = 0;       ///< model_state_bytes' gradient shards
  int64_t optimizer_state_bytes = 0;  ///< model_state_bytes' optimizer state
  /// On a GPU (zeros on the CPU): the step's peak of the device's allocated
  /// bytes (the CUDA caching allocator's, every tensor there), and how much
  /// of the device holds model state at the step's end (the shards, their
  /// gradients and the optimizer state that live there: none with offload).
  ///@{
  int64_t device_peak_bytes = 0;
  int64_t device_model_state_bytes = 0;
  ///@}
  /// The device's model state by kind (their sum is device_model_state_bytes),
  /// and the step's peak of the units' gathered parameter buffers there
  /// (counted exactly where fsdp-cpp fills and frees them; the rest of device_peak_bytes
  /// is activations, gradient buffers and temporaries).
  ///@{
  int64_t device_param_shard_bytes = 0;
  int64_t device_grad_shard_bytes = 0;
  int64_t device_optimizer_state_bytes = 0;
  int64_t device_gathered_peak_bytes = 0;
  ///@}
};

/// What one step did: the loss, whether it stepped, and its figures.
struct StepResult {
  double loss = 0.0;        ///< the global-batch mean, the same on every rank
  bool stepped = true;      ///< false: skipped on every rank (an inf or NaN under loss scaling)
  std::optional<double> grad_norm;  ///< before clipping, when clipping is on
  std::optional<double> loss_scale;  ///< after this step, when loss scaling is on
  double step_s = 0.0;        ///< wall time of the whole step
  double optimizer_s = 0.0;   ///< unscaling, clipping and the optimizer's step
  CommStats comm;             ///< the units' collectives in this step (comm.wait_seconds: exposed communication)
  /// Disk offload's traffic in this step, and the time compute waited on it
  /// (zeros without disk offload).
  ///@{
  int64_t offload_bytes_read = 0, offload_bytes_written = 0;
  double offload_wait_s = 0.0;
  ///@}
  double offload_copy_s = 0.0;      ///< the offload's I/O thread in this step: copying through staging buffers
  int64_t offload_bytes_staged = 0;  ///< ... and the bytes it copied (the rest moved in place)
  double offload_checksum_s = 0.0;  ///< the offload's I/O thread in this step: checksumming blocks
  double offload_disk_s = 0.0;      ///< the offload's I/O thread in this step: waiting on the disk
  int offload_read_ahead = 0;       ///< the units this step read ahead (OffloadStats::read_ahead at its start)
  RankFigures figures;        ///< this rank's
  std::vector<RankFigures> per_rank;  ///< every rank's, when gathered
};

/// One optimizer step of a sharded model per call (see fsdp/train_step.h).
class TrainStep {
 public:
  /// The optimizer must step exactly state.parameters() (the local shards),
  /// and be one whose state can be sharded (Adam, AdamW, SGD): anything else
  /// is refused here, by name. With disk offload (OffloadPolicy::nvme) it must be an
  /// fsdp::FusedAdamW, and its step goes through the offload's pipeline.
  TrainStep(FsdpState& state, torch::optim::Optimizer& optimizer, TrainStepOptions options = TrainStepOptions());
  /// The same, over the model fully_shard() returned.
  template <class M>
  TrainStep(FullyShardedModule<M>& model, torch::optim::Optimizer& optimizer,
            TrainStepOptions options = TrainStepOptions())
      : TrainStep(model.state(), optimizer, std::move(options)) {}

  /// Returns this rank's mean loss of micro-batch `micro` (0 <= micro <
  /// micro_steps()): a scalar that requires grad.
  using LossFn = std::function<torch::Tensor(int64_t micro)>;
  /// Collective: runs the micro-steps' forward and backward, then the
  /// optimizer step (or skips it on overflow), and zeroes the gradients.
  StepResult operator()(const LossFn& loss_fn);

  /// The loss_divisor (next_token_loss, LanguageModel::forward) for a loss
  /// that is the mean over the whole global batch's `global_targets` targets
  /// that carry loss (every rank's, every micro-step's): global_targets /
  /// (micro_steps x world size), since the step averages the micro-steps'
  /// losses and the ranks' gradients. A mean of each micro-batch's own mean
  /// would weigh a token of a short answer more than one of a long answer
  /// (transformers' accumulation bug of 2024, fixed by num_items_in_batch).
  /// Throws unless global_targets >= 1.
  double token_loss_divisor(int64_t global_targets) const;
  /// The options it was made with.
  const TrainStepOptions& options() const { return options_; }
  /// Whether the reduction runs only on the last micro-step.
  bool syncs_only_last_micro_step() const { return skip_sync_; }
  /// The loss scaler, or null when loss scaling is off (to restore its
  /// scale from a checkpoint: scaler()->set_scale_factor(s)).
  GradScaler* scaler() const { return scaler_.get(); }
  /// The sharded model it steps.
  FsdpState& state() const { return state_; }
  /// The optimizer of the model's shards.
  torch::optim::Optimizer& optimizer() const { return optimizer_; }

 private:
  FsdpState& state_;
  torch::optim::Optimizer& optimizer_;
  TrainStepOptions options_;
  std::unique_ptr<GradScaler> scaler_;
  bool skip_sync_ = false;
};

}  // namespace fsdp
