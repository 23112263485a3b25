#include "fsdp/grad_utils.h"

#include <cmath>

namespace fsdp {
double clip_grad_norm_(FsdpState& state, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  double sum_of_squares = 0.0;
  for (const auto& shard : state.parameters()) {
    if (shard.grad().defined()) sum_of_squares += shard.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  torch::Tensor total = torch::tensor({sum_of_squares}, torch::kDouble);
  // The shard group partitions the model: summing over it counts every
  // element once (replicas across nodes hold the same shards; no_shard has no
  // shard group and every rank holds the whole gradient).
  if (state.shard_group()) state.shard_group()->all_reduce(total, ReduceOp::kSum)->wait();
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& shard : state.parameters()) {
      if (shard.grad().defined()) shard.grad().mul_(coefficient);
    }
  }
  return norm;
}

GradScaler::GradScaler(FsdpState& state, GradScalerOptions options)
    : state_(state), options_(options), scale_(options.init_scale()) {
  TORCH_CHECK(scale_ > 0 && options_.growth_factor() > 1 && options_.backoff_factor() > 0 &&
                  options_.backoff_factor() < 1 && options_.growth_interval() > 0,
              "GradScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0");
}

bool GradScaler::unscale_() {
  if (unscaled_) return found_inf_;
  torch::NoGradGuard no_grad;
  bool local_inf = false;
  for (const auto& shard : state_.parameters()) {
    if (!shard.grad().defined()) continue;
    shard.grad().mul_(1.0 / scale_);
    local_inf = local_inf || !torch::isfinite(shard.grad()).all().item<bool>();
  }
  torch::Tensor any = torch::tensor({local_inf ? 1 : 0}, torch::kInt);
  state_.group()->all_reduce(any, ReduceOp::kSum)->wait();
  found_inf_ = any.item<int>() > 0;
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  const bool overflow = unscale_();
  if (!overflow) optimizer.step();
  if (overflow) {
    scale_ *= options_.backoff_factor();
    good_steps_ = 0;
  } else if (++good_steps_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    good_steps_ = 0;
  }
  unscaled_ = false;
  return !overflow;
}

}  // namespace fsdp
