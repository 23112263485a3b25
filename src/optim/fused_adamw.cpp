// FusedAdamW::step: torch::optim::AdamW's bookkeeping (state, step count,
// bias corrections), with the update itself done by kernels::adamw_update
// over chunks of each parameter in parallel.

#include "fsdp/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <vector>

// ATen's multi-tensor fused AdamW (LibTorch 2.x; not in 1.13).
#if __has_include(<ATen/ops/_fused_adamw.h>)
#include <ATen/ops/_fused_adamw.h>
#define FSDP_HAS_ATEN_FUSED_ADAMW 1
#else
#define FSDP_HAS_ATEN_FUSED_ADAMW 0
#endif

#include "base/parallel.h"
#include "base/compat.h"
#include "base/device_context.h"
#include "optim/adamw_kernel.h"

namespace fsdp {

namespace {
// Elements per parallel task: large enough that a task's start costs nothing
// against its memory traffic (16 bytes read and written per element).
constexpr int64_t kGrain = 1 << 16;

// What both fused paths take: float32, contiguous, a dense gradient of the
// same, all on `device`.
bool multi_tensor_fusable(const torch::Tensor& p, const c10::Device& device) {
  if (!p.grad().defined()) return true;
  return p.device() == device && p.scalar_type() == torch::kFloat && p.is_contiguous() && !p.grad().is_sparse() &&
         p.grad().scalar_type() == torch::kFloat && p.grad().is_contiguous() && p.grad().sizes() == p.sizes() &&
         p.grad().device() == device;
}
// What the own kernel takes: the same, on the CPU (a parameter without a
// gradient is skipped either way).
bool fusable(const torch::Tensor& p) {
  return !p.grad().defined() || (in_host_memory(p) && multi_tensor_fusable(p, p.device()));
}

// The parameter's AdamW state, made as AdamW::step makes it on first use.
torch::optim::AdamWParamState& state_of(FusedAdamW& optimizer, const torch::Tensor& p) {
  auto& slot = optimizer.state()[compat::optimizer_state_key(optimizer, p)];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}
}  // namespace

bool FusedAdamW::multi_tensor_available() { return FSDP_HAS_ATEN_FUSED_ADAMW; }

bool FusedAdamW::steps_multi_tensor() const {
  if (!multi_tensor_available()) return false;
  std::optional<c10::Device> device;
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!device) device = p.device();
      if (is_host_device(*device) || !multi_tensor_fusable(p, *device)) return false;
    }
  }
  return device.has_value();
}

void FusedAdamW::step_multi_tensor() {
  TORCH_CHECK(multi_tensor_available(), "FusedAdamW::step_multi_tensor: this LibTorch (", TORCH_VERSION,
              ") has no at::_fused_adamw_ (LibTorch 2.x has)");
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "FusedAdamW::step_multi_tensor: amsgrad is not fused");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<float> steps;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(multi_tensor_fusable(p, group.params().front().device()), "FusedAdamW::step_multi_tensor: a ",
                  "parameter of shape ", p.sizes(), " (", p.scalar_type(), " on ", p.device(), ") is not contiguous ",
                  "float32 with a dense gradient of its shape on the group's device");
      auto& s = state_of(*this, p);
      s.step(s.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      steps.push_back(static_cast<float>(s.step()));
    }
    if (params.empty()) continue;
#if FSDP_HAS_ATEN_FUSED_ADAMW
    // The kernel reads each parameter's step count (after the increment,
    // as PyTorch's optimizer passes it) from the device: filled there, so
    // the host does not wait for a copy. The counts are equal unless a
    // parameter had no gradient in some step.
    const auto on_device = torch::TensorOptions().dtype(torch::kFloat).device(params.front().device());
    torch::Tensor step_counts = torch::full({static_cast<int64_t>(steps.size())}, steps.front(), on_device);
    for (size_t i = 1; i < steps.size(); ++i) {
      if (steps[i] != steps.front()) step_counts[static_cast<int64_t>(i)].fill_(steps[i]);
    }
    std::vector<torch::Tensor> state_steps;
    for (int64_t i = 0; i < step_counts.numel(); ++i) state_steps.push_back(step_counts[i]);
    const auto [beta1, beta2] = options.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, options.lr(), beta1,
                      beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false, /*maximize=*/false);
#endif
  }
}

bool FusedAdamW::fuses_all() const {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!fusable(p)) return false;
    }
  }
  return true;
}

void FusedAdamW::step_parameter(const torch::optim::AdamWOptions& options, const torch::Tensor& p) {
  if (!p.grad().defined()) return;
  TORCH_CHECK(fusable(p) && !options.amsgrad(), "FusedAdamW::step_parameter: a parameter of shape ", p.sizes(), " (",
              p.scalar_type(), " on ", p.device(), ") cannot be fused: it needs contiguous float32 on the CPU, a dense "
              "gradient of its shape, and no amsgrad");
  torch::NoGradGuard no_grad;
  auto& s = state_of(*this, p);
  TORCH_CHECK(s.exp_avg().is_contiguous() && s.exp_avg_sq().is_contiguous() &&
                  s.exp_avg().scalar_type() == torch::kFloat && s.exp_avg().numel() == p.numel(),
              "FusedAdamW: the state of a parameter of ", p.numel(), " elements is not contiguous float32 of "
              "that size (exp_avg ", s.exp_avg().sizes(), " ", s.exp_avg().scalar_type(), "); with disk offload the state is "
              "on disk between steps: step through fsdp::TrainStep, which brings it in");
  s.step(s.step() + 1);
  const auto [beta1, beta2] = options.betas();
  kernels::AdamWStep update{static_cast<float>(options.lr()),
                            static_cast<float>(beta1),
                            static_cast<float>(beta2),
                            static_cast<float>(options.eps()),
                            static_cast<float>(options.weight_decay()),
                            1.0 - std::pow(beta1, static_cast<double>(s.step())),
                            1.0 - std::pow(beta2, static_cast<double>(s.step()))};
  float* param = p.data_ptr<float>();
  const float* grad = p.grad().data_ptr<float>();
  float* exp_avg = s.exp_avg().data_ptr<float>();
  float* exp_avg_sq = s.exp_avg_sq().data_ptr<float>();
  parallel::for_each_chunk(0, p.numel(), kGrain, at::get_num_threads(), [&](int64_t begin, int64_t end) {
    kernels::adamw_update(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, update);
  });
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  const bool on_host = fuses_all();
  const bool on_device = !on_host && steps_multi_tensor();
  if (!on_host && !on_device) return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  if (on_device) {
    step_multi_tensor();
    return loss;
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) step_parameter(options, p);
  }
  return loss;
}

}  // namespace fsdp
