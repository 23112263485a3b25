#pragma once
// The element-wise AdamW update behind fsdp::FusedAdamW, on raw float arrays
// (no LibTorch types: its file compiles in a moment and vectorizes).

#include <cstdint>

namespace fsdp::kernels {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  double bias_correction1, bias_correction2;  // 1 - beta^step, in double as torch::optim::AdamW has them
};

// One AdamW update of n contiguous floats, in torch::optim::AdamW's order of
// operations.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWStep& s);

}  // namespace fsdp::kernels
