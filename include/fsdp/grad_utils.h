#pragma once
/// \file
/// Gradient clipping and fp16 loss scaling over sharded gradients: both look
/// at the whole model across every shard and every rank, so that every rank
/// makes the same decision.

#include <torch/torch.h>

#include <functional>

#include "fsdp/fully_shard.h"

namespace fsdp {

/// PyTorch's FSDP.clip_grad_norm_: the 2-norm of the whole model's gradient
/// (each element counted once: shards summed over the shard group, replicas
/// not, padding contributing zero), and every shard's gradient scaled by
/// max_norm / (norm + 1e-6) when that is below 1. Collective; returns the
/// norm before clipping, the same on every rank.
double clip_grad_norm_(FsdpState& state, double max_norm);

/// GradScaler's schedule of the scale (PyTorch's GradScaler arguments and defaults).
struct GradScalerOptions {
  GradScalerOptions() = default;
  /// The first scale factor.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The factor the scale grows by after growth_interval steps without an overflow.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// The factor the scale shrinks by at an overflow (the step skipped).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Steps without an overflow before the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

/// Dynamic loss scaling for fp16 gradients (PyTorch's ShardedGradScaler):
/// \code{.cpp}
/// scaler.scale(loss).backward();
/// bool stepped = scaler.step(optimizer);   // unscales, checks, steps or skips
/// \endcode
/// The overflow check is agreed over the model's whole group, so a step is
/// skipped on every rank or on none.
class GradScaler {
 public:
  /// Over the shards of `state` (it must outlive the scaler).
  explicit GradScaler(FsdpState& state, GradScalerOptions options = GradScalerOptions());
  /// The loss times the scale factor: call backward() on this.
  torch::Tensor scale(const torch::Tensor& loss) const { return loss * scale_; }
  /// Divides the shards' gradients by the scale; returns true if any rank
  /// found an inf or NaN. Called by step() if not called before (e.g. to
  /// clip the unscaled gradients first).
  bool unscale_();
  /// Steps the optimizer unless an overflow was found, then adapts the scale.
  bool step(torch::optim::Optimizer& optimizer);
  /// The same, with the optimizer's step made by `take_step` (disk offload's).
  bool step(const std::function<void()>& take_step);
  /// The current scale factor.
  double scale_factor() const { return scale_; }
  /// Restores a scale (e.g. the one a checkpoint saved).
  void set_scale_factor(double scale) {
    TORCH_CHECK(scale > 0, "GradScaler: the scale must be positive, got ", scale);
    scale_ = scale;
  }

 private:
  FsdpState& state_;
  GradScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace fsdp
