#pragma once
/// \file
/// LoRA (Hu et al., 2021) under FSDP, as Hugging Face PEFT builds it: each
/// targeted torch::nn::Linear keeps its weight, frozen, and gains two small
/// trainable matrices, so that
///
///     y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,   A: r x in,  B: out x r
///
/// with B zero at first (the model starts as it was). The adapters are
/// registered under the linear as PEFT names them (`q_proj.lora_A.weight`,
/// `q_proj.lora_B.weight`), so they shard with the linear's unit; everything
/// else is frozen, and fully_shard keeps frozen parameters out of the
/// gradients, the reductions and the optimizer (docs/fine-tuning.md).
///
/// \code{.cpp}
/// auto report = fsdp::lora::apply(*model, fsdp::lora::LoraOptions().rank(8).alpha(16).targets({"q_proj", "v_proj"}));
/// auto sharded = fsdp::fully_shard(model, group, options);   // after apply
/// \endcode
///
/// A model's forward calls an adapted linear through fsdp::lora::forward(linear, x)
/// (one line per linear, as fsdp::unit_forward marks unit boundaries): a
/// torch::nn::Linear's own forward cannot be extended from outside, and
/// apply() leaves its `weight` member undefined so that a direct call fails
/// instead of silently leaving the adapter out. The GPT and the Llama do so
/// for every linear they have.

#include <torch/arg.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::lora {

/// What apply() is asked for: PEFT's LoraConfig, with its defaults.
struct LoraOptions {
  /// r, the adapters' inner dimension (PEFT's `r`).
  TORCH_ARG(int64_t, rank) = 8;
  /// The scaling's numerator: the update is scaled by alpha / rank (PEFT's `lora_alpha`).
  TORCH_ARG(double, alpha) = 8.0;
  /// Dropout on the adapter's input while training (PEFT's `lora_dropout`); 0 = none.
  TORCH_ARG(double, dropout) = 0.0;
  /// Which linears: a module whose name is one of these or ends with "." and
  /// one of these (PEFT's `target_modules` as a list). "all-linear" adapts
  /// every torch::nn::Linear but the output head `lm_head`, as PEFT does.
  TORCH_ARG(std::vector<std::string>, targets) = std::vector<std::string>{"q_proj", "v_proj"};
  /// The seed of A's initial values: each A is drawn from a generator seeded
  /// by this and its name, so the values depend on neither the world size nor
  /// the order of initialization (init_parameter).
  TORCH_ARG(uint64_t, seed) = 0;
};

/// What apply() did.
struct LoraReport {
  std::vector<std::string> adapted;  ///< the linears' names, in module order
  int64_t parameters = 0;            ///< every parameter's elements after apply (a tied one once)
  int64_t trainable = 0;             ///< the adapters' elements: all that trains
};

/// Adds an adapter to every linear `options.targets` names and freezes every
/// other parameter of `model` (requires_grad false). Before fully_shard.
/// Refuses a target that names no module, or a module that is not a
/// torch::nn::Linear, a rank below 1, alpha not positive, dropout outside
/// [0, 1), and a model that has adapters already.
LoraReport apply(torch::nn::Module& model, const LoraOptions& options);

/// `linear`(x) with its adapter, if apply() gave it one; `linear`(x) otherwise.
torch::Tensor forward(const torch::nn::Linear& linear, const torch::Tensor& x);

/// Whether `name` (a parameter's, as the model names it) is an adapter's: it
/// ends with ".lora_A.weight" or ".lora_B.weight".
bool is_adapter_parameter(const std::string& name);

/// An adapter parameter's initial values, in place: A from a uniform on
/// [-1/sqrt(in), 1/sqrt(in)] (nn.Linear's default, PEFT's kaiming_uniform
/// with a = sqrt(5)) drawn from a generator seeded by `seed` and `name`; B
/// zero. For FullyShardOptions::param_init_fn under sharded initialization,
/// where apply()'s own values never existed.
void init_parameter(const std::string& name, torch::Tensor& param, uint64_t seed);

/// The adapters' settings, as apply() recorded them in the model.
struct AdapterInfo {
  std::string linear;   ///< the adapted linear's name
  int64_t rank = 0;     ///< r
  double alpha = 0.0;   ///< alpha
  double dropout = 0.0; ///< dropout on the adapter's input while training
  double scaling() const { return alpha / static_cast<double>(rank); }  ///< alpha / r: the update's scale
};
/// Every adapter of `model`, in module order (none if apply() never ran).
std::vector<AdapterInfo> adapters(const torch::nn::Module& model);

}  // namespace fsdp::lora
