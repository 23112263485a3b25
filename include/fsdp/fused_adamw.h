#pragma once
/// \file
/// FusedAdamW: AdamW in one pass over memory.
///
/// AdamW in one pass over memory: torch::optim::AdamW's update, element by
/// element, reading each parameter, gradient and moment once and writing each
/// once, vectorized and split across LibTorch's intra-op threads.
///
/// \code{.cpp}
/// fsdp::FusedAdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}));
/// \endcode
///
/// torch::optim::AdamW makes six passes over the shard and allocates a
/// shard-sized temporary for its denominator each step; on a 76-million-element
/// shard (preset large at W = 2, 1 thread) that took 1.7 s of a step.
///
/// It IS a torch::optim::AdamW (same options, same per-parameter state:
/// step, exp_avg, exp_avg_sq), so checkpoints, optimizer-state sharding and
/// resharding treat it as one, and a run may resume with either. Results equal
/// AdamW's to float rounding (tests/test_optimizer_kernels.cpp checks 1e-6 relative over 10
/// steps), not bit for bit: the fused expression rounds in another order.
/// Parameters on a GPU (all on one, float32, contiguous) are stepped by
/// ATen's multi-tensor fused AdamW kernel, one launch per group (PyTorch's
/// fused=True; LibTorch 2.x). Others (sparse gradients, amsgrad, mixed
/// devices, or a GPU on LibTorch 1.x) are stepped by torch::optim::AdamW::step.

#include <torch/torch.h>


namespace fsdp {

/// torch::optim::AdamW with a fused step (see fsdp/fused_adamw.h): the same
/// options and per-parameter state, one pass over memory per step.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  /// AdamW's step, fused (see fuses_all() and steps_multi_tensor() for which path).
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// True when step() fuses every parameter (false: it falls back to AdamW's).
  bool fuses_all() const;
  /// One parameter's update, as step() makes it (nothing without a gradient):
  /// for a caller that brings each parameter's state in and out of memory
  /// around its step (disk offload). The parameter must be fusable.
  void step_parameter(const torch::optim::AdamWOptions& options, const torch::Tensor& param);

  /// Whether this LibTorch has ATen's multi-tensor fused AdamW.
  static bool multi_tensor_available();
  /// True when step() uses it: every parameter on one GPU, fusable.
  bool steps_multi_tensor() const;
  /// Steps every parameter with a gradient through it, wherever the
  /// parameters are (the CPU too: the tests check it against AdamW there).
  void step_multi_tensor();
};


}  // namespace fsdp
