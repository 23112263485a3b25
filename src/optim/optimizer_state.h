#pragma once
// The optimizers whose state can be sharded (not installed: TrainStep and
// the checkpoints ask it; docs/checkpoints.md lists them for users).
//
/// The optimizers whose state fsdp-cpp can shard, checkpoint and reshard: those
/// whose state is element-wise, shaped like each parameter, so that a shard's
/// state is the same slice of the whole model's state as the shard is of the
/// parameters.
/// \code{.unparsed}
///   torch::optim::Adam, AdamW   exp_avg, exp_avg_sq (and max_exp_avg_sq with
///                               amsgrad), plus a step count
///   torch::optim::SGD           momentum_buffer with momentum; none without
/// \endcode
/// Anything else (LBFGS's history, a user's own optimizer) is refused by name
/// when a TrainStep or a checkpoint meets it.

#include <torch/torch.h>

#include <string>
#include <vector>

namespace fsdp {

/// The element-wise state of an optimizer whose state can be sharded (the
/// optimizers listed in fsdp/optimizer_state.h), read and written per parameter.
class OptimizerState {
 public:
  /// Throws, naming the optimizer, if its state cannot be sharded.
  explicit OptimizerState(torch::optim::Optimizer& optimizer);

  /// The optimizer it reads and writes.
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  /// "adam", "adamw" or "sgd": what checkpoints record.
  const std::string& type() const { return type_; }
  /// The element-wise state tensors each parameter has, in file order.
  const std::vector<std::string>& tensor_names() const { return tensor_names_; }

  /// Whether the optimizer has state for `param` (it has stepped it, or a
  /// checkpoint gave it some).
  bool has_state(const torch::Tensor& param) const;
  /// The step count of `param`'s state (0 without state, and for SGD).
  int64_t step(const torch::Tensor& param) const;
  /// State tensor `name` of `param` for reading (a save): the optimizer's own
  /// tensor, or zeros where it has no state yet (none is created).
  torch::Tensor value(const torch::Tensor& param, const std::string& name) const;
  /// State tensor `name` of `param`, as the optimizer holds it. Creates the
  /// state, zeros and step 0, as the optimizer's first step would, if there
  /// is none: call only where that is what the optimizer does (Adam's first
  /// step; not SGD's, whose momentum starts at the first gradient).
  torch::Tensor tensor(const torch::Tensor& param, const std::string& name);
  /// Sets `param`'s step count (creating its state if needed).
  void set_step(const torch::Tensor& param, int64_t step);
  /// Drops `param`'s state: its next step starts afresh.
  void clear(const torch::Tensor& param);

 private:
  torch::optim::Optimizer& optimizer_;
  std::string type_;
  std::vector<std::string> tensor_names_;
};

/// The optimizer's own name for error messages (its C++ type).
std::string optimizer_name(const torch::optim::Optimizer& optimizer);

}  // namespace fsdp
