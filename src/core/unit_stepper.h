#pragma once
// The optimizer's update of one unit at a time, in core. A placement that
// keeps a unit's optimizer state out of memory between steps (disk offload)
// schedules and stores: it brings a unit's shard and state in, asks the
// stepper to update it, and sends them out. The stepper knows the
// optimizer: the decay, the update, the group options, which state tensors
// a unit has. So the placement names no optimizer (DeepSpeed's split, where
// the optimizer calls swap_in / swap_out around each sub-group's step).
// Not installed.

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace fsdp {

class FlatParam;
class FusedAdamW;

// What a step does to every gradient before any unit steps (TrainStep's
// loss scaling and clipping), for a placement that takes each gradient as
// it arrives and keeps it out of memory (disk offload's step before the
// next gather): prepare_gradient() does it to each.
struct StepPreparation {
  std::optional<double> unscale;  // each gradient times this first (1 / the loss scale), as GradScaler::unscale_
  bool clips = false;             // clipping will need each gradient's sum of squares
  bool asks_anything() const { return unscale.has_value() || clips; }
};

// Unscales `grad` in place and returns its figures (FlatParam's
// PreparedGradient), exactly as GradScaler::unscale_ and clip_grad_norm_
// treat a gradient in memory, so the step's decisions are the same.
struct PreparedGradient;
PreparedGradient prepare_gradient(torch::Tensor& grad, const StepPreparation& preparation);

// Refuses, naming it, an optimizer that cannot update one unit alone (for
// a placement whose state leaves memory): fsdp::FusedAdamW only.
void check_steps_unit_by_unit(const torch::optim::Optimizer& optimizer);

class UnitStepper {
 public:
  // Over `optimizer`, with the matrices' decoupled decay (TrainStepOptions::
  // weight_decay; 0: none). Any optimizer may list its moments;
  // only fsdp::FusedAdamW updates (update()).
  explicit UnitStepper(torch::optim::Optimizer& optimizer, double matrix_weight_decay = 0);

  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  double matrix_weight_decay() const { return matrix_weight_decay_; }
  // Whether the optimizer steps the buffer's shard (a frozen buffer's it never does).
  bool steps(const FlatParam& flat) const;
  // The optimizer's state of the unit's shard that a placement may keep out
  // of memory, as the optimizer holds it now: Adam's and AdamW's two
  // moments (exp_avg, exp_avg_sq), the optimizer's own tensors; none before
  // the first step that gave the unit a gradient, nor for other optimizers.
  std::vector<torch::Tensor> moments(const FlatParam& flat) const;
  // The unit's update, its shard, gradient and state in memory: its
  // gradient times `clip_coefficient` where that is below 1
  // (clip_grad_norm_'s scaling), the matrices' decay (decay()), then
  // FusedAdamW::step_parameter with its group's options.
  void update(const FlatParam& flat, double clip_coefficient = 1.0) const;
  // The matrices' decay alone, for a unit without a gradient this step
  // (decay_matrix_weights_ decays every shard the optimizer holds).
  void decay(const FlatParam& flat) const;
  // A stepper for updates applied after this step returned (before each
  // unit's next gather): the groups' options copied as they are now, since
  // the loop may change the learning rate before then.
  std::shared_ptr<const UnitStepper> for_later() const;

 private:
  const torch::optim::AdamWOptions& options_of(const FlatParam& flat) const;

  torch::optim::Optimizer& optimizer_;
  FusedAdamW* fused_ = nullptr;
  double matrix_weight_decay_ = 0;
  // Each shard's group options: the optimizer's own, or copies (for_later).
  std::unordered_map<const c10::TensorImpl*, const torch::optim::AdamWOptions*> options_;
  std::vector<std::unique_ptr<torch::optim::AdamWOptions>> copies_;
};

}  // namespace fsdp
