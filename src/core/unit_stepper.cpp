// The optimizer's update of one unit at a time (core/unit_stepper.h).

#include "core/unit_stepper.h"

#include "core/flat_param.h"
#include "core/grad_utils_internal.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/memory.h"
#include "optim/optimizer_state.h"

namespace fsdp {

PreparedGradient prepare_gradient(torch::Tensor& grad, const StepPreparation& preparation) {
  torch::NoGradGuard no_grad;
  PreparedGradient prepared;
  if (preparation.unscale) {
    grad.mul_(*preparation.unscale);
    prepared.finite = torch::isfinite(grad).all().item<bool>();
  }
  if (preparation.clips) prepared.sum_of_squares = detail::sum_of_squares_in_double(grad);
  return prepared;
}

void check_steps_unit_by_unit(const torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(dynamic_cast<const FusedAdamW*>(&optimizer), "fsdp::TrainStep: a model with disk offload (OffloadPolicy::nvme) steps with ",
              "fsdp::FusedAdamW (it brings each unit's state in and out of memory around that unit's update); got ",
              optimizer_name(optimizer));
}

UnitStepper::UnitStepper(torch::optim::Optimizer& optimizer, double matrix_weight_decay)
    : optimizer_(optimizer), fused_(dynamic_cast<FusedAdamW*>(&optimizer)), matrix_weight_decay_(matrix_weight_decay) {
  for (auto& group : optimizer_.param_groups()) {
    const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&group.options());
    for (const auto& p : group.params()) options_[p.unsafeGetTensorImpl()] = adamw;
  }
}

bool UnitStepper::steps(const FlatParam& flat) const { return options_.count(flat.shard().unsafeGetTensorImpl()) > 0; }

std::vector<torch::Tensor> UnitStepper::moments(const FlatParam& flat) const {
  // Asked of the optimizer's type first: OptimizerState refuses an optimizer
  // whose state it cannot shard, and any optimizer may be asked.
  if (!dynamic_cast<torch::optim::AdamW*>(&optimizer_) && !dynamic_cast<torch::optim::Adam*>(&optimizer_)) return {};
  OptimizerState state(optimizer_);
  if (!state.has_state(flat.shard())) return {};
  return {state.tensor(flat.shard(), "exp_avg"), state.tensor(flat.shard(), "exp_avg_sq")};
}

const torch::optim::AdamWOptions& UnitStepper::options_of(const FlatParam& flat) const {
  const auto found = options_.find(flat.shard().unsafeGetTensorImpl());
  TORCH_CHECK(found != options_.end(), "fsdp: unit ", flat.index(), "'s shard is not the optimizer's");
  TORCH_CHECK(found->second, "fsdp: unit ", flat.index(), " is stepped alone, which needs AdamW's options; the "
              "optimizer is ", optimizer_name(optimizer_));
  return *found->second;
}

void UnitStepper::decay(const FlatParam& flat) const {
  if (matrix_weight_decay_ > 0) decay_shard_matrices_(flat, options_of(flat).lr(), matrix_weight_decay_);
}

void UnitStepper::update(const FlatParam& flat, double clip_coefficient) const {
  TORCH_CHECK(fused_, "fsdp: a unit is stepped alone with fsdp::FusedAdamW only; the optimizer is ",
              optimizer_name(optimizer_));
  const auto& options = options_of(flat);
  torch::NoGradGuard no_grad;
  const torch::Tensor& shard = flat.shard();
  if (clip_coefficient < 1.0) shard.grad().mul_(clip_coefficient);  // as clip_grad_norm_
  decay(flat);
  memory::MemoryCategoryScope scope(memory::Category::kOptimizerState);  // a first step's fresh moments
  fused_->step_parameter(options, shard);
}

std::shared_ptr<const UnitStepper> UnitStepper::for_later() const {
  auto later = std::make_shared<UnitStepper>(optimizer_, matrix_weight_decay_);
  std::unordered_map<const torch::optim::AdamWOptions*, const torch::optim::AdamWOptions*> copy_of;
  for (auto& [shard, options] : later->options_) {
    if (!options) continue;
    auto& copy = copy_of[options];
    if (!copy) {
      later->copies_.push_back(std::make_unique<torch::optim::AdamWOptions>(*options));
      copy = later->copies_.back().get();
    }
    options = copy;
  }
  return later;
}

}  // namespace fsdp
