#pragma once
// What an FsdpState holds behind its pointer: the units, the offload, the
// device context, the gather order, the groups and the pass's bookkeeping,
// with the events units call (the autograd-driven hooks, prefetch, the end of
// backward). The engine's own; not installed. Engine code and tests reach a
// state's parts through detail::units(), detail::flat_params(),
// detail::shard_offload() and detail::device_context() below.

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "fsdp/fully_shard.h"
#include "core/unit.h"
#include "core/unit_plan.h"

namespace fsdp {

class Unit;              // core/unit.h
class FlatParam;         // core/flat_param.h
struct FlatParamConfig;  // core/flat_param.h
class DeviceContext;     // base/device_context.h
class GatherOrder;       // core/gather_order.h
namespace offload {
class ShardOffload;      // core/shard_offload.h
struct PlacementChoice;  // core/shard_offload.h
}

namespace detail {

struct FsdpStateImpl {
  // Keeps the arguments; build() does the rest of FsdpState's construction.
  FsdpStateImpl(FsdpState& self, std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group,
                FullyShardOptions options);
  ~FsdpStateImpl();
  FsdpStateImpl(const FsdpStateImpl&) = delete;
  FsdpStateImpl& operator=(const FsdpStateImpl&) = delete;

  // The engine behind `state`.
  static FsdpStateImpl& of(const FsdpState& state) { return *state.impl_; }

  // FsdpState's construction: plans the units of module_, shards each over
  // group_ (collective). Runs once the state holds this (the offload's
  // hooks read the units through the state). `placements` makes the
  // offload the options ask for (src/offload/placements.cpp hands it over).
  void build(const offload::PlacementChoice& placements);

  const FullyShardOptions& options() const { return options_; }
  bool requires_gradient_sync() const { return requires_gradient_sync_; }

  Unit& root_unit() const { return *units_.front(); }
  // Called by units: the first backward event of a pass queues the
  // end-of-backward callback that finishes every unit's reduction.
  void on_backward_event();
  void on_forward_entered(Unit& unit);
  // Prefetch: issues the all-gathers of the units that run after `unit`
  // in forward, or in backward (the reverse order), within the limiter.
  void prefetch_after(const Unit& unit, bool backward);
  // A unit began its forward or backward: a prefetch of it is used up.
  void on_unit_started(Unit& unit);
  // Waits for the gradient reductions in flight and accumulates them into
  // the shards' gradients (hybrid: after the all-reduce across replicas).
  // With CPU offload on a GPU, wait_for_host_copies = false leaves the
  // gradients' copies to the host that this call issues in flight (the
  // next call, or the end of backward, finishes them).
  void finish_reductions_in_flight(bool wait_for_host_copies = true);
  // Gathers issued ahead for units that did not run (a pass that took
  // another path, or a forward without backward): waited for and freed.
  void release_unused_prefetches();
  // The root's forward ended without autograd (evaluation): the pass is over.
  void finish_forward_without_backward();
  // A forward failed: rethrows the error, naming the units that were never
  // entered through unit_forward in it (their parameters were still
  // sharded, the usual cause of the shape errors a direct call produces).
  // Call only from a catch block (it may rethrow the error being handled).
  [[noreturn]] void rethrow_forward_error(const c10::Error& error) const;
  // UnshardScope: every unit gathered (or, leaving, back at rest).
  void set_unsharded_scope(bool on, bool writeback);
  bool in_unshard_scope() const { return unshard_scope_; }

  void finish_backward();
  void recover_from_failed_backward();
  void issue_prefetch(Unit* unit, bool backward);
  void issue_deferred_prefetches();
  void make_groups();
  // Builds a Unit per unit plan (root first) and a buffer per buffer plan
  // (`buffers`: a unit's trainable parameters, then its frozen ones where
  // it has any, then its NF4 weights: kinds[b]), materializing and initializing parameters
  // through options().param_init_fn() when one is given: a buffer is built
  // (and its full parameters freed) once its last parameter is done.
  void build_units(std::vector<UnitPlan> buffers, const std::vector<BufferKind>& kinds, const FlatParamConfig& config);
  // Builds buffer `index` (its place in flat_params_) and gives it to `unit`.
  void make_buffer(Unit& unit, UnitPlan plan, const FlatParamConfig& config, size_t index, BufferKind kind);
  // Every rank must have planned the same units with the same sizes, or the
  // first collective would pair different buffers: checked at construction.
  void check_same_plan_on_every_rank(const std::vector<UnitPlan>& plans) const;

  FsdpState& self_;  // the state that holds this (what the offload and ResidentScope take)
  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroupPtr group_;
  FullyShardOptions options_;
  ProcessGroupPtr shard_group_, replicate_group_;
  ProcessGroupPtr host_group_, cross_host_group_;  // ZeroPlusPlus (make_groups)
  torch::Tensor host_major_ranks_;                 // ZeroPlusPlus: see FlatParamConfig::host_major_ranks
  int hosts_ = 1;  // how many hosts the ranks are on (make_groups)
  c10::Device device_ = c10::Device(torch::kCPU);
  // Before units_ and offload_: the offload's copies use its streams.
  std::unique_ptr<DeviceContext> device_context_;
  // The gathers' order on a device (null on the CPU and with offload); before
  // units_, whose configs point at it.
  std::unique_ptr<GatherOrder> gather_order_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<FlatParam*> flat_params_;  // the units' buffers, in units_' order (owned by them)
  bool backward_callback_queued_ = false;
  bool requires_gradient_sync_ = true;
  bool unshard_scope_ = false;
  bool in_train_step_ = false;  // a TrainStep is running the micro-steps (a placement that keeps state out of memory refuses any other backward)
  // The order units entered forward in this pass and in the last whole one.
  std::vector<Unit*> forward_order_this_pass_, forward_order_;
  std::vector<std::pair<Unit*, bool>> deferred_prefetches_;  // (unit, for backward) over the limit
  int prefetched_unused_ = 0;
  int max_prefetched_unused_ = 0;
  // After units_: destroyed first (disk offload's reads ahead land in it).
  std::unique_ptr<offload::ShardOffload> offload_;
};

// The units of `state`, root first.
inline const std::vector<std::unique_ptr<Unit>>& units(const FsdpState& state) { return FsdpStateImpl::of(state).units_; }
// Every unit's buffers in that order, a unit's trainable one before its
// frozen one: what the placements, state dicts and checkpoints walk, one
// shard at a time (FlatParam::index() is the position here).
inline const std::vector<FlatParam*>& flat_params(const FsdpState& state) { return FsdpStateImpl::of(state).flat_params_; }
// Where the units' shards live between uses.
inline offload::ShardOffload& shard_offload(const FsdpState& state) { return *FsdpStateImpl::of(state).offload_; }
// The device and the streams the units' shards cross on.
inline const DeviceContext& device_context(const FsdpState& state) { return *FsdpStateImpl::of(state).device_context_; }

}  // namespace detail
}  // namespace fsdp
