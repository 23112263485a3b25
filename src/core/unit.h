#pragma once
// One FSDP unit: its flat parameter and its checked state machine, driven by
// unit_forward and by autograd hooks. The engine's own; not installed.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "base/compat.h"
#include "core/flat_param.h"
#include "fsdp/fully_shard.h"

namespace fsdp {

// Where a unit is in its step. Every transition is checked:
//   kSharded|kUnsharded -> kForward -> kSharded (full_shard, hybrid_shard) or kUnsharded (the others)
//   kSharded|kUnsharded -> kBackward -> kSharded, or kUnsharded (no_shard, zero1: never sharded)
// kForward and kBackward always hold the parameters unsharded.
enum class UnitState { kSharded, kUnsharded, kForward, kBackward };
const char* unit_state_name(UnitState state);

namespace detail {
struct FsdpStateImpl;
}

class Unit {
 public:
  Unit(detail::FsdpStateImpl* owner, UnitPlan plan, FlatParamConfig config);
  const std::string& name() const { return name_; }  // "" for the root
  size_t index() const { return flat_.unit_index(); }  // its position in detail::units()
  std::string display_name() const;
  UnitState state() const { return state_; }
  const FlatParam& flat_param() const { return flat_; }
  FlatParam& flat_param() { return flat_; }
  const torch::nn::Module* module() const { return module_; }
  // Frozen parameters (requires_grad false when sharded) are a unit of
  // their own, right after their owner in detail::units(): the owner gathers
  // and frees them with its own (same boundary, prefetch and reshard) and
  // moves their state with its own, but never reduces them. Every path that
  // walks the units (state dicts, checkpoints, residency, memory) so sees
  // them under their names, and only FsdpState::parameters() leaves them out.
  // frozen_part(): the owner's frozen unit, or null; is_frozen_part(): this
  // is one (its module is the owner's; it is not registered for it).
  Unit* frozen_part() const { return frozen_part_; }
  bool is_frozen_part() const { return flat_.frozen(); }

  // Activation checkpointing: whether this unit's forward runs without
  // keeping activations, and the body that runs (and reruns) it.
  bool checkpointed() const;
  std::function<torch::Tensor(const torch::Tensor&)>& checkpoint_body() { return checkpoint_body_; }

  // Lifecycle events (called by unit_forward and by autograd hooks).
  void pre_forward();
  void post_forward();
  void pre_backward();
  // A checkpointed unit's backward, after its forward was recomputed and
  // before its gradients are computed.
  void before_recomputed_gradients();
  void on_gradient_ready();
  // The gradient of one of the unit's inputs is computed (watch_input's
  // marker): the unit's backward is over for that input.
  void on_input_gradient();
  void post_backward();
  // unit_forward saw one more input that requires grad in this forward.
  void count_input() { ++inputs_watched_; }

 private:
  void transition(std::initializer_list<UnitState> from, UnitState to);
  // The unit's gathers and frees, of its frozen part too.
  void start_gathers();
  void finish_gathers();
  void reshard_all();

  detail::FsdpStateImpl* owner_;
  std::string name_;
  torch::nn::Module* module_;
  FlatParam flat_;
  Unit* frozen_part_ = nullptr;  // set by FsdpStateImpl::build_units
  // Held here because autograd keeps gradient accumulators only weakly: a
  // dropped one is recreated later without our post hook. Created while the
  // parameters have their full shape and compute dtype, which they fix.
  std::vector<compat::NodePtr> grad_accumulators_;
  std::function<torch::Tensor(const torch::Tensor&)> checkpoint_body_;
  UnitState state_ = UnitState::kSharded;
  bool prefetched_ = false;  // its all-gather was issued ahead, and it has not run since
  double span_begin_us_ = -1.0;  // tracing: when the current forward or backward began
  // Backward is over once every trainable parameter's gradient and every
  // watched input's gradient are in: the parameters alone can be done while
  // the input's gradient still needs the frozen ones (LoRA's base, a frozen
  // norm), and a unit's buffers must outlive every node of its backward.
  int64_t gradients_pending_ = 0;
  int64_t inputs_watched_ = 0;
  bool entered_in_this_forward_ = false;
  bool backward_done_in_this_pass_ = false;
  friend struct detail::FsdpStateImpl;
};

// The unit registered for a module, or nullptr if the module is no unit.
Unit* find_unit(const torch::nn::Module* module);

}  // namespace fsdp
