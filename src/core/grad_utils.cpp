#include "fsdp/grad_utils.h"
#include "core/grad_utils_internal.h"
#include "base/device_context.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <unordered_map>

#include "base/parallel.h"
#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "core/shard_offload.h"

namespace fsdp {
namespace detail {

// The sum of a gradient's squares, accumulated in double in an order fixed
// by the element indices alone: chunks of kChunk elements, each summed in
// eight interleaved lanes, the chunks' sums added in chunk order. So the
// result depends neither on the thread count nor on where the data happens
// to lie in memory (ATen's float norm() does: its vectorized loop starts at
// the first aligned element, and two runs of one model differed in the last
// bit), and a float32 gradient needs no double copy (on `large` that copy
// and its square were 1.2 GB of fresh memory per rank and step).
double sum_of_squares_in_double(const torch::Tensor& grad) {
  if (!in_host_memory(grad) || grad.scalar_type() != torch::kFloat || !grad.is_contiguous()) {
    return grad.to(torch::kDouble).pow(2).sum().item<double>();
  }
  constexpr int64_t kChunk = 1 << 16;
  const float* data = grad.data_ptr<float>();
  const int64_t n = grad.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> chunk_sums(chunks);
  parallel::for_each_chunk(0, chunks, 1, at::get_num_threads(), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const float* x = data + c * kChunk;
      const int64_t m = std::min(kChunk, n - c * kChunk);
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= m; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
      for (; i < m; ++i) lane[0] += static_cast<double>(x[i]) * x[i];
      chunk_sums[c] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
  });
  double total = 0.0;
  for (double s : chunk_sums) total += s;
  return total;
}

}  // namespace detail

torch::Tensor clip_grad_norm_tensor_(FsdpState& state, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  bool on_host = true;
  // The gradients in memory, and those prepared as they arrived (their
  // sums of squares taken then: disk offload's), in the shards' order.
  double sum_of_squares = 0.0;
  std::vector<PreparedGradient*> prepared;
  for (const auto& unit : detail::units(state)) {
    const torch::Tensor& shard = unit->flat_param().shard();
    if (!shard.grad().defined()) {
      if (auto& gradient = unit->flat_param().prepared_gradient()) {
        sum_of_squares += gradient->sum_of_squares;
        prepared.push_back(&*gradient);
      }
      continue;
    }
    grads.push_back(shard.grad());
    on_host = on_host && in_host_memory(shard.grad());
    if (on_host) sum_of_squares += detail::sum_of_squares_in_double(shard.grad());
  }
  if (!on_host) return detail::clip_gradients_queued(grads, state.shard_group(), max_norm);
  torch::Tensor total = torch::tensor({sum_of_squares}, torch::kDouble);
  // The shard group partitions the model: summing over it counts every
  // element once (replicas across nodes hold the same shards; no_shard has no
  // shard group and every rank holds the whole gradient).
  if (state.shard_group()) state.shard_group()->all_reduce(total, ReduceOp::kSum)->wait();
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (auto& grad : grads) grad.mul_(coefficient);
    for (PreparedGradient* gradient : prepared) gradient->clip_coefficient = coefficient;  // applied when it steps
  }
  return torch::tensor(norm, torch::kDouble);
}

double clip_grad_norm_(FsdpState& state, double max_norm) {
  return clip_grad_norm_tensor_(state, max_norm).item<double>();
}

namespace detail {

torch::Tensor clip_gradients_queued(const std::vector<torch::Tensor>& grads, const ProcessGroupPtr& shard_group,
                                    double max_norm) {
  TORCH_CHECK(!grads.empty(), "clip_gradients_queued: expected at least one gradient, got none");
  torch::NoGradGuard no_grad;
  // Each gradient's float norm (the reduction accumulates in float; a
  // double copy would be 8 bytes an element of fresh device memory),
  // squared and summed in double.
  torch::Tensor total = torch::zeros({1}, grads.front().options().dtype(torch::kDouble));
  for (const auto& grad : grads) total.add_(grad.norm().to(torch::kDouble).square());
  if (shard_group) shard_group->all_reduce(total, ReduceOp::kSum)->wait();
  torch::Tensor norm = total.sqrt().reshape({});
  // min(1, max_norm / (norm + 1e-6)); a factor of exactly 1 leaves a
  // gradient unchanged, so scaling every one needs no branch on the host.
  const torch::Tensor coefficient = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  for (const auto& grad : grads) grad.mul_(coefficient);
  return norm;
}

}  // namespace detail

std::vector<std::pair<int64_t, int64_t>> matrix_ranges_of_shard(const FlatParam& flat) {
  // The shard is elements [r*S, (r+1)*S) of the padded flat buffer.
  const int64_t shard_begin = flat.shard_rank() * flat.shard_numel(), shard_end = shard_begin + flat.shard_numel();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const FlatParamEntry& entry : flat.entries()) {
    if (entry.shape.size() < 2) continue;
    const int64_t begin = std::max(entry.offset, shard_begin), end = std::min(entry.offset + entry.numel, shard_end);
    if (begin < end) ranges.emplace_back(begin - shard_begin, end - shard_begin);
  }
  return ranges;
}

void decay_shard_matrices_(const FlatParam& flat, double lr, double weight_decay) {
  torch::NoGradGuard no_grad;
  const double factor = 1.0 - lr * weight_decay;
  const torch::Tensor& shard = flat.shard();
  for (const auto& [begin, end] : matrix_ranges_of_shard(flat)) shard.narrow(0, begin, end - begin).mul_(factor);
}

void decay_matrix_weights_(FsdpState& state, torch::optim::Optimizer& optimizer, double weight_decay) {
  TORCH_CHECK(weight_decay >= 0, "decay_matrix_weights_: weight_decay must be >= 0, got ", weight_decay);
  if (weight_decay == 0) return;
  std::unordered_map<const c10::TensorImpl*, const FlatParam*> flat_of_shard;
  for (const auto& unit : detail::units(state)) {
    flat_of_shard[unit->flat_param().shard().unsafeGetTensorImpl()] = &unit->flat_param();
  }
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      auto found = flat_of_shard.find(param.unsafeGetTensorImpl());
      TORCH_CHECK(found != flat_of_shard.end(), "decay_matrix_weights_: the optimizer steps a tensor of shape ",
                  param.sizes(), " that is no shard of the model");
      decay_shard_matrices_(*found->second, group.options().get_lr(), weight_decay);
    }
  }
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
  for (const auto& unit : detail::units(state_)) {
    const torch::Tensor& shard = unit->flat_param().shard();
    if (!shard.grad().defined()) {
      // Unscaled as it arrived (disk offload's prepared gradients).
      const auto& gradient = unit->flat_param().prepared_gradient();
      local_inf = local_inf || (gradient && !gradient->finite);
      continue;
    }
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
  return step([&optimizer] { optimizer.step(); });
}

bool GradScaler::step(const std::function<void()>& take_step) {
  const bool overflow = unscale_();
  if (!overflow) take_step();
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
