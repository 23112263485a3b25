// The optimizer's kernels (single process): FusedAdamW against
// torch::optim::AdamW through its own kernel and ATen's multi-tensor one,
// and gradient clipping as queued on a GPU, run on the CPU's kernels. The
// optimizer steps of a sharded model are in test_optimizers.cpp.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "base/compat.h"
#include "core/grad_utils_internal.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/grad_utils.h"



namespace {

// FusedAdamW against torch::optim::AdamW (1e-6 relative in norm, per tensor,
// parameters and both moments): two parameter groups (one with
// weight decay), sizes that are not multiples of any vector width or of the
// parallel grain, 10 steps with fresh gradients each, one parameter without
// a gradient in step 4 (so the step counts differ). `take_step` steps the fused
// optimizer: its own kernel (step()) or ATen's multi-tensor one.
void expect_fused_adamw_equals_torch_adamw(const std::function<void(fsdp::FusedAdamW&)>& take_step) {
  torch::manual_seed(7);
  const std::vector<int64_t> sizes = {1, 7, 1000, (1 << 16) + 3, 300001};
  std::vector<torch::Tensor> init, reference, fused;
  for (int64_t n : sizes) init.push_back(torch::randn({n}));
  for (auto& t : init) {
    reference.push_back(t.clone().requires_grad_(true));
    fused.push_back(t.clone().requires_grad_(true));
  }
  auto groups = [&](std::vector<torch::Tensor>& p) {
    auto decayed = std::make_unique<torch::optim::AdamWOptions>(3e-3);
    decayed->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
    auto plain = std::make_unique<torch::optim::AdamWOptions>(1e-2);
    plain->betas({0.8, 0.99}).eps(1e-6).weight_decay(0.0);
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup({p[0], p[2], p[4]}, std::move(decayed)),
        torch::optim::OptimizerParamGroup({p[1], p[3]}, std::move(plain))};
  };
  torch::optim::AdamW torch_adamw(groups(reference), torch::optim::AdamWOptions(1e-3));
  fsdp::FusedAdamW fused_adamw(groups(fused), torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 10; ++step) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      torch::Tensor g = torch::randn({sizes[i]}) * static_cast<double>(i + 1);
      reference[i].mutable_grad() = step == 3 && i == 1 ? torch::Tensor() : g.clone();
      fused[i].mutable_grad() = step == 3 && i == 1 ? torch::Tensor() : g.clone();
    }
    EXPECT_TRUE(fused_adamw.fuses_all());
    EXPECT_FALSE(fused_adamw.steps_multi_tensor());  // on the CPU step() uses its own kernel
    torch_adamw.step();
    take_step(fused_adamw);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const torch::Tensor a = reference[i].detach(), b = fused[i].detach();
    // Relative to the tensor's norm: single elements near 0 carry the
    // rounding of their larger neighbours.
    auto relative = [](const torch::Tensor& x, const torch::Tensor& y) {
      return ((x - y).norm() / x.norm()).item<double>();
    };
    EXPECT_LT(relative(a, b), 1e-6) << "parameter of " << sizes[i] << " elements";
    EXPECT_FALSE(torch::equal(a, init[i])) << "parameter of " << sizes[i] << " elements did not move";
    auto& sa = static_cast<torch::optim::AdamWParamState&>(
        *torch_adamw.state().at(fsdp::compat::optimizer_state_key(torch_adamw, reference[i])));
    auto& sb = static_cast<torch::optim::AdamWParamState&>(
        *fused_adamw.state().at(fsdp::compat::optimizer_state_key(fused_adamw, fused[i])));
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_LT(relative(sa.exp_avg(), sb.exp_avg()), 1e-6) << "exp_avg of " << sizes[i] << " elements";
    EXPECT_LT(relative(sa.exp_avg_sq(), sb.exp_avg_sq()), 1e-6) << "exp_avg_sq of " << sizes[i] << " elements";
  }
}

}  // namespace

TEST(FusedAdamW, EqualsTorchAdamWWithinFloatRoundingOverTenSteps) {
  expect_fused_adamw_equals_torch_adamw([](fsdp::FusedAdamW& optimizer) { optimizer.step(); });
  // A double parameter: AdamW's own step for all of them, still correct.
  torch::Tensor d = torch::ones({5}, torch::kDouble).requires_grad_(true);
  fsdp::FusedAdamW mixed(std::vector<torch::Tensor>{d}, torch::optim::AdamWOptions(0.1));
  d.mutable_grad() = torch::ones({5}, torch::kDouble);
  EXPECT_FALSE(mixed.fuses_all());
  mixed.step();
  EXPECT_NEAR(d[0].item<double>(), 1.0 * (1 - 0.1 * 0.01) - 0.1, 1e-7);
}

// The path step() takes for parameters on a GPU (ATen's multi-tensor fused
// kernel), run on the CPU, where that kernel exists too (LibTorch >= 2.4):
// ATen's CPU kernel of the op, not its CUDA one, is what runs here.
TEST(FusedAdamW, TheGpusMultiTensorPathOnTheCpuKernelEqualsTorchAdamW) {
  if (!fsdp::FusedAdamW::multi_tensor_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no at::_fused_adamw_ (the GPU path falls back to AdamW's)";
  }
  expect_fused_adamw_equals_torch_adamw([](fsdp::FusedAdamW& optimizer) { optimizer.step_multi_tensor(); });
}

// Clipping as queued on a GPU (no host wait: the norm stays a tensor), run
// on the CPU's kernels and with no process group (so no all-reduce of the
// norm): what it proves of a GPU is the arithmetic, not the device. The norm of all gradients together (float norms squared and
// summed in double), every gradient scaled by max / (norm + 1e-6) when that
// is below 1, and left bit for bit when it is not.
TEST(GradClipping, TheGpusQueuedPathOnCpuKernelsWithoutAGroupClipsByTheGlobalNorm) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> grads = {torch::randn({1000}), torch::randn({7}) * 3, torch::randn({70001}) * 0.1};
  double sum = 0;
  for (const auto& g : grads) sum += g.to(torch::kDouble).pow(2).sum().item<double>();
  const double expected = std::sqrt(sum);
  std::vector<torch::Tensor> before;
  for (const auto& g : grads) before.push_back(g.clone());
  const torch::Tensor norm = fsdp::detail::clip_gradients_queued(grads, nullptr, 1.0);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_EQ(norm.scalar_type(), torch::kDouble);
  EXPECT_NEAR(norm.item<double>(), expected, 1e-6 * expected);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(grads[i], before[i] * (1.0 / (expected + 1e-6)), 1e-5, 1e-8)) << "gradient " << i;
  }
  std::vector<torch::Tensor> small = {before[0] * 1e-3};
  const torch::Tensor unchanged = small[0].clone();
  fsdp::detail::clip_gradients_queued(small, nullptr, 1.0);
  EXPECT_TRUE(torch::equal(small[0], unchanged));
  EXPECT_THROW(fsdp::detail::clip_gradients_queued({}, nullptr, 1.0), c10::Error);
}
