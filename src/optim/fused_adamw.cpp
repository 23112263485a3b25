// FusedAdamW::step: torch::optim::AdamW's bookkeeping (state, step count,
// bias corrections), with the update itself done by kernels::adamw_update
// over chunks of each parameter in parallel.

#include "fsdp/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "fsdp/compat.h"

namespace fsdp {

namespace {
// Elements per parallel task: large enough that a task's start costs nothing
// against its memory traffic (16 bytes read and written per element).
constexpr int64_t kGrain = 1 << 16;

bool fusable(const torch::Tensor& p) {
  if (!p.grad().defined()) return true;  // skipped either way
  return p.device().is_cpu() && p.scalar_type() == torch::kFloat && p.is_contiguous() && !p.grad().is_sparse() &&
         p.grad().scalar_type() == torch::kFloat && p.grad().is_contiguous() && p.grad().sizes() == p.sizes();
}
}  // namespace

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
  auto& slot = state()[compat::optimizer_state_key(*this, p)];
  if (!slot) {  // as AdamW::step initializes it
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
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
  at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
    kernels::adamw_update(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, update);
  });
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  if (!fuses_all()) return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) step_parameter(options, p);
  }
  return loss;
}

}  // namespace fsdp
