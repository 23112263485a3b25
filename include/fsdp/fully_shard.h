#pragma once
/// \file
/// Sharding a model: fully_shard(), unit_forward() and UnshardScope.
///
/// fully_shard(): sharded data parallelism (ZeRO-1/2/3, DDP, hybrid) for a
/// torch::nn::Module; FULL_SHARD (ZeRO-3) by default.
///
/// \code{.cpp}
/// auto model = fsdp::fully_shard(MyModel(...), group,
///     fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<BlockImpl>()));
/// torch::optim::AdamW optimizer(model.parameters(), ...);   // the local shards
/// auto loss = model.forward(x, y);  loss.backward();  optimizer.step();
/// \endcode
///
/// Unit boundaries are marked in the model by calling a submodule through
/// fsdp::unit_forward(block, args...) instead of block->forward(args...): one
/// line per boundary. The wrap policy decides which boundaries become units;
/// for the others unit_forward is a plain call.

#include <torch/arg.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/offload.h"
#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"

namespace fsdp {

class Unit;  // one unit's parameters and lifecycle: the engine's own, not installed
class FsdpState;
namespace detail {
struct FsdpStateImpl;  // what an FsdpState holds: the engine's own, not installed
// A forward failed: rethrows the error, naming the units it did not enter
// through unit_forward (FullyShardedModule::forward calls it from its catch).
[[noreturn]] void rethrow_forward_error(const FsdpState& state, const c10::Error& error);
}  // namespace detail

/// Everything fully_shard() attaches to a model: its units and their hooks.
/// What a user calls is public; the engine (the units, where their shards
/// live, the autograd-driven hooks) is behind a pointer, not installed.
class FsdpState {
 public:
  /// What fully_shard() makes (call that instead): plans the units of
  /// `module` by options.wrap_policy(), shards each over `group` (collective).
  FsdpState(std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group, FullyShardOptions options);
  ~FsdpState();
  FsdpState(const FsdpState&) = delete;
  FsdpState& operator=(const FsdpState&) = delete;

  /// The local shards, one leaf per unit: hand these to the optimizer.
  std::vector<torch::Tensor> parameters() const;
  /// How many units fully_shard() made (the root included).
  size_t num_units() const;
  /// What the disk offload (OffloadPolicy::nvme) is and has
  /// moved so far, or nothing without one.
  std::optional<offload::NvmeOffloadInfo> nvme_offload() const;
  /// Whether the units' gathers run ahead of the compute on the shard group's
  /// gather stream (a device, no offload). Such a
  /// run holds one resharded unit's buffer more than the prefetch limit says
  /// (as FSDP2 holds the previous all-gather's output).
  bool gathers_run_ahead() const;
  /// The group fully_shard() was given (every rank of the model).
  const ProcessGroupPtr& group() const;
  /// The options fully_shard() was given.
  const FullyShardOptions& options() const;
  /// Where the units compute (FullyShardOptions::device, else the parameters').
  c10::Device device() const;
  /// The sharded model (its parameters are views into the gathered buffers).
  torch::nn::Module& module() const;
  /// The groups the units communicate over (not the caller's group, so that
  /// their traffic is counted apart): null where the strategy has none.
  const ProcessGroupPtr& shard_group() const;
  /// \copydoc shard_group()
  const ProcessGroupPtr& replicate_group() const;
  /// ZeroPlusPlus's groups: the ranks of this rank's host (secondary
  /// partition's gathers, the first step of a quantized reduction), and one
  /// rank of every host, those with this rank's place in its host (the
  /// quantized reduction's all-to-all); null where no option needs them.
  const ProcessGroupPtr& host_group() const;
  /// \copydoc host_group()
  const ProcessGroupPtr& cross_host_group() const;
  /// Bytes moved by the units' collectives, per kind, over all their groups.
  CommStats comm_stats() const;
  /// The part of comm_stats() moved by groups that span hosts (the shard
  /// group of a world-sharded strategy over several hosts, the replicate
  /// group of a hybrid one, cross_host_group()), as the planner's
  /// CommBytes::cross_host counts it; comm_stats() less this stays inside a host.
  CommStats cross_host_comm_stats() const;
  /// Zeroes comm_stats() (every group's counters).
  void reset_comm_stats();

  /// With sync off, backward leaves each parameter's gradient unreduced in
  /// its .grad, accumulating over micro-steps (PyTorch's no_sync); the next
  /// backward with sync on reduces the sum.
  void set_requires_gradient_sync(bool sync);
  /// Whether backward reduces the gradients (set_requires_gradient_sync()).
  bool requires_gradient_sync() const;
  /// Throws unless every unit is at rest and no reduction is in flight (the
  /// state between steps). On a device it also ends a pass that a forward
  /// without backward left open, so that the gathers and shard writes of
  /// what follows (state dicts, checkpoints, UnshardScope) follow the compute.
  void check_idle() const;

  /// Diagnostics of the all-gather limiter: the most prefetched units that
  /// were waiting unused at once, since the last reset.
  int max_prefetched_unused() const;
  /// Starts a new window for max_prefetched_unused().
  void reset_prefetch_stats();

 private:
  friend struct detail::FsdpStateImpl;  // the engine: its way to impl_
  std::unique_ptr<detail::FsdpStateImpl> impl_;
};

/// Gathers every unit's whole parameters for the scope's life (PyTorch's
/// summon_full_params, FSDP2's unshard()): to evaluate or generate with them,
/// read them, or call the model's modules directly. Collective on entry and
/// on exit; the model must be between steps. The parameters are in the param
/// dtype. A forward inside the scope keeps them; a backward is refused. With
/// writeback (fp32 params only), changes made to the parameters in the scope
/// are copied into the shards on exit; without, they are discarded.
/// \code{.cpp}
/// { fsdp::UnshardScope whole(model.state());  auto logits = model->logits(idx); }
/// \endcode
class UnshardScope {
 public:
  /// Gathers every unit of `state` (collective); `writeback`: see the class.
  explicit UnshardScope(FsdpState& state, bool writeback = false);
  ~UnshardScope();
  UnshardScope(const UnshardScope&) = delete;
  UnshardScope& operator=(const UnshardScope&) = delete;

 private:
  FsdpState& state_;
  bool writeback_;
};

namespace detail {

// Runs the unit's pre-forward on construction and its post-forward on
// destruction (also when forward throws). Nothing for a module that is no unit.
class UnitForwardScope {
 public:
  explicit UnitForwardScope(const torch::nn::Module* module);
  ~UnitForwardScope();
  UnitForwardScope(const UnitForwardScope&) = delete;
  UnitForwardScope& operator=(const UnitForwardScope&) = delete;
  // Registers the pre-backward hook on an output that requires grad.
  void watch_output(const torch::Tensor& output) const;
  // The input, marked so that the unit hears when its gradient is done (an
  // identity; the input itself where there is no backward to wait for).
  torch::Tensor watch_input(const torch::Tensor& input) const;
  // The unit's forward is to run checkpointed (the option is on, it is not
  // the root, and autograd is recording).
  bool checkpointed() const;
  // Runs `body` on `input` keeping no activations; backward reruns it (see
  // FullyShardOptions::activation_checkpointing).
  torch::Tensor run_checkpointed(std::function<torch::Tensor(const torch::Tensor&)> body,
                                 const torch::Tensor& input) const;
  [[noreturn]] void refuse_checkpointing() const;

 private:
  Unit* unit_;
};

inline void watch_outputs(const UnitForwardScope& scope, const torch::Tensor& t) { scope.watch_output(t); }
inline void watch_outputs(const UnitForwardScope& scope, const std::vector<torch::Tensor>& ts) {
  for (const auto& t : ts) scope.watch_output(t);
}
template <class... Ts>
void watch_outputs(const UnitForwardScope& scope, const std::tuple<Ts...>& ts) {
  std::apply([&](const auto&... t) { (watch_outputs(scope, t), ...); }, ts);
}
template <class T>
void watch_outputs(const UnitForwardScope&, const T&) {}  // outputs without tensors

// A tensor argument of unit_forward, marked (UnitForwardScope::watch_input); others as they are.
template <class A>
decltype(auto) watch_input(const UnitForwardScope& scope, A&& arg) {
  if constexpr (std::is_same_v<std::decay_t<A>, torch::Tensor>) {
    return scope.watch_input(arg);
  } else {
    return std::forward<A>(arg);
  }
}

// The module behind a plain module, a ModuleHolder (including the classes
// TORCH_MODULE declares) or a shared_ptr.
template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};
template <class M>
auto& module_ref(M& module) {
  if constexpr (torch::detail::is_module_holder<M>::value || is_shared_ptr<std::remove_cv_t<M>>::value) {
    return *module;
  } else {
    return module;
  }
}

}  // namespace detail

namespace detail {
// A checkpointed unit's forward: the first argument is the tensor the
// recompute starts from; the others (a SequencePacking, flags) are copied
// into the recompute, which runs after this call has returned.
template <class M, class First, class... Rest>
torch::Tensor run_checkpointed_forward(const UnitForwardScope& scope, M& m, First&& first, Rest&&... rest) {
  auto body = [&m, kept = std::make_tuple(std::decay_t<Rest>(rest)...)](const torch::Tensor& x) {
    return std::apply([&](const auto&... r) { return m.forward(x, r...); }, kept);
  };
  return scope.run_checkpointed(body, watch_input(scope, std::forward<First>(first)));
}
// An argument after the first that is copied into the recompute as it is:
// one that could carry a gradient (a tensor, an optional or a list of them)
// would lose it, so such a unit is refused.
template <class T>
constexpr bool carries_tensors() {
  using D = std::decay_t<T>;
  return std::is_convertible_v<D, torch::Tensor> || std::is_same_v<D, std::optional<torch::Tensor>> ||
         std::is_same_v<D, std::vector<torch::Tensor>> || std::is_same_v<D, torch::TensorList>;
}
template <class First, class... Rest>
constexpr bool checkpointable_arguments() {
  return std::is_convertible_v<First, torch::Tensor> && (!carries_tensors<Rest>() && ...);
}
}  // namespace detail

/// Calls module.forward(args...) as a unit boundary: if the module is a unit,
/// its parameters are gathered for the call and freed after it, and its
/// backward gathers them again and reduce-scatters their gradients.
template <class M, class... Args>
auto unit_forward(M&& module, Args&&... args) {
  auto& m = detail::module_ref(module);
  detail::UnitForwardScope scope(&m);
  using Output = decltype(m.forward(std::forward<Args>(args)...));
  if (scope.checkpointed()) {
    if constexpr (sizeof...(Args) >= 1 && std::is_same_v<Output, torch::Tensor>) {
      if constexpr (detail::checkpointable_arguments<Args...>()) {
        torch::Tensor output = detail::run_checkpointed_forward(scope, m, std::forward<Args>(args)...);
        detail::watch_outputs(scope, output);
        return output;
      } else {
        scope.refuse_checkpointing();
      }
    } else {
      scope.refuse_checkpointing();
    }
  }
  auto output = m.forward(detail::watch_input(scope, std::forward<Args>(args))...);
  detail::watch_outputs(scope, output);
  return output;
}

/// The handle fully_shard() returns: forward goes through the root unit.
template <class M>
class FullyShardedModule {
 public:
  /// What fully_shard() returns: `module` and the state that shards it.
  FullyShardedModule(std::shared_ptr<M> module, std::shared_ptr<FsdpState> state)
      : module_(std::move(module)), state_(std::move(state)) {}

  /// The model's forward through the root unit (see unit_forward). A shape
  /// error is rethrown naming the units the forward called directly instead
  /// of through unit_forward (their parameters were still sharded).
  template <class... Args>
  auto forward(Args&&... args) {
    try {
      return unit_forward(*module_, std::forward<Args>(args)...);
    } catch (const c10::Error& error) {
      detail::rethrow_forward_error(*state_, error);
    }
  }
  /// forward(), as LibTorch's modules are called.
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  /// The model's own members. A direct call of its modules' forward skips the unit
  /// boundaries: make it inside an UnshardScope.
  M* operator->() const { return module_.get(); }
  /// The model itself.
  M& module() const { return *module_; }
  /// The model's shared pointer.
  const std::shared_ptr<M>& ptr() const { return module_; }
  /// The local shards, one leaf per unit: hand these to the optimizer (FsdpState::parameters).
  std::vector<torch::Tensor> parameters() const { return state_->parameters(); }
  /// The sharding state: what TrainStep, checkpoints and state dicts take.
  FsdpState& state() const { return *state_; }

 private:
  std::shared_ptr<M> module_;
  std::shared_ptr<FsdpState> state_;
};

/// Shards `module` over `group`. Every rank must pass a model with the same
/// structure and the same initial values (e.g. built from the same seed).
template <class M>
FullyShardedModule<M> fully_shard(std::shared_ptr<M> module, ProcessGroupPtr group,
                                  FullyShardOptions options = FullyShardOptions()) {
  auto state = std::make_shared<FsdpState>(module, std::move(group), std::move(options));
  return FullyShardedModule<M>(std::move(module), std::move(state));
}
/// \copydoc fully_shard(std::shared_ptr<M>, ProcessGroupPtr, FullyShardOptions)
/// A module holder (a class TORCH_MODULE declares) shards the module it holds.
template <class Impl>
FullyShardedModule<Impl> fully_shard(torch::nn::ModuleHolder<Impl> holder, ProcessGroupPtr group,
                                     FullyShardOptions options = FullyShardOptions()) {
  return fully_shard(holder.ptr(), std::move(group), std::move(options));
}

}  // namespace fsdp
