#pragma once
// One FSDP unit: its flat parameter and its checked state machine, driven by
// unit_forward and by autograd hooks. The engine's own; not installed.

#include <torch/torch.h>

#include <functional>
#include <memory>
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

// What one of a unit's buffers holds: its trainable parameters, its frozen
// ones, or its frozen linear weights in NF4 (MixedPrecision::frozen_nf4).
enum class BufferKind { kTrainable, kFrozen, kNf4 };

namespace detail {
struct FsdpStateImpl;
}

class Unit {
 public:
  // A unit named `name` ("" for the root) over `module`, with no buffers
  // yet: FsdpStateImpl::build_units adopts them (adopt()) as their
  // parameters are ready.
  Unit(detail::FsdpStateImpl* owner, std::string name, torch::nn::Module* module);
  const std::string& name() const { return name_; }
  std::string display_name() const;
  UnitState state() const { return state_; }
  // Its trainable parameters: every parameter when none is frozen (and
  // none when all are).
  const FlatParam& flat_param() const { return *flat_; }
  FlatParam& flat_param() { return *flat_; }
  // Its frozen parameters (requires_grad false when sharded), or null: a
  // buffer of their own, so that the trainable one keeps gradients,
  // reductions and optimizer state for trainable elements only. The unit
  // gathers, frees and moves it with the trainable one, and never reduces it.
  FlatParam* frozen_params() const { return frozen_.get(); }
  // Its NF4 weights (MixedPrecision::frozen_nf4), or null: a frozen buffer
  // of their own, held as bytes.
  FlatParam* nf4_params() const { return nf4_.get(); }
  // Its buffers: the trainable one, then the frozen one if any (the
  // gathers and frees walk them at every unit boundary: kept, not rebuilt).
  const std::vector<FlatParam*>& buffers() const { return buffers_; }
  const torch::nn::Module* module() const { return module_; }
  // Takes one of its buffers (trainable or frozen, FlatParam::frozen()),
  // just built: the trainable one's gradient accumulators get the hook
  // that counts its gradients in, then the parameters become views.
  void adopt(std::unique_ptr<FlatParam> buffer);

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
  // The gathers and frees of every buffer of the unit.
  void start_gathers();
  void finish_gathers();
  void reshard_all();

  detail::FsdpStateImpl* owner_;
  std::string name_;
  torch::nn::Module* module_;
  std::unique_ptr<FlatParam> flat_, frozen_, nf4_;
  std::vector<FlatParam*> buffers_;  // flat_, then frozen_ and nf4_ if any (adopt())
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
