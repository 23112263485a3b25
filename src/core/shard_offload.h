#pragma once
// One seam for where a model's unit shards live between uses (FSDP2's
// OffloadPolicy): in memory, in (pinned) host memory, or on disk. One
// ShardOffload per model, made by fully_shard from its options and handed
// to every unit's FlatParam (FlatParamConfig::offload). Through it a unit
//   fetches its shard for the all-gather          fetch()
//   hands over its reduced gradient               accept_gradient()
//   is stepped when the placement schedules it    step(), begin_step_in_backward()
//   is made resident for state dicts, checkpoints ResidentScope (set_resident)
// The placement schedules and stores; the update itself is core's
// (UnitStepper: the decay, the optimizer, the clip coefficient), so no
// placement names an optimizer. The engine asks it and never what kind it
// is: the training step, the state dicts and the checkpoints hold no
// offload-specific branch. Not installed.

#include <torch/torch.h>

#include <c10/core/StreamGuard.h>

#include <functional>
#include <memory>
#include <optional>

#include "core/unit_stepper.h"
#include "fsdp/offload.h"
#include "fsdp/options.h"

namespace fsdp {
class DeviceContext;
class FlatParam;
class FsdpState;
}  // namespace fsdp

namespace fsdp::offload {

// What fetch() hands the all-gather.
struct GatherInput {
  torch::Tensor values;   // the shard's current values in the param dtype, shard_numel() elements
  torch::Tensor staging;  // kept alive until the gather ends (what `values` was cast from), or undefined
  // The gather is issued with this stream current (the copy stream the shard
  // crossed on, so that it waits for the copy and the compute stream does
  // not), or null: the current stream.
  std::unique_ptr<c10::StreamGuard> stream;
  // Where the input was copied into the buffer without a collective (a
  // shard group of one): what lets the compute stream use the buffer after
  // it (CPU offload: it waits for the copy stream), or nothing.
  std::function<void(GatherInput&)> finish_local;
};

// A unit's shard as the placement plans for it before the unit is built:
// its elements, and whether it is a frozen part (requires_grad false: no
// gradient and no optimizer state ever, so nothing of the step's to keep).
struct ShardPlan {
  int64_t numel = 0;
  bool frozen = false;
};

// What a placement keeps of one unit between uses (CPU offload's pinned
// gradient buffer and the copy in flight, disk offload's slots in the
// scratch file): hung on the unit's FlatParam (FlatParam::offload_state),
// so that no placement keeps per-unit state beside the units, by index.
class UnitOffloadState {
 public:
  virtual ~UnitOffloadState() = default;
};

class ShardOffload {
 public:
  virtual ~ShardOffload() = default;

  // Where the shards are between uses, in messages: "memory", "pinned host memory", "disk".
  virtual const char* where() const = 0;
  // Whether the shards (and the optimizer state) never leave memory: all
  // but disk offload (nvme_info()). Then a ResidentScope has nothing to do,
  // and is no collective either. Where they leave it, the optimizer steps a
  // unit at a time (check_steps_unit_by_unit), and only inside
  // fsdp::TrainStep, whose step brings each unit's state in around its
  // update (a plain backward is refused).
  bool keeps_state_in_memory() const { return !nvme_info().has_value(); }
  // Called before the units are built, with the model's state and each
  // unit's shard (disk offload makes its scratch file), and after each unit
  // is built (disk offload moves its shard there at once, so that a
  // sharded initialization never holds every shard).
  virtual void prepare(FsdpState& state, const std::vector<ShardPlan>& shards) {}
  virtual void unit_built(FlatParam& flat) {}

  // The fp32 shard of a unit being built, from `slice`, its part of the
  // initial values (on the unit's device): a copy that does not alias it.
  virtual torch::Tensor make_shard(const torch::Tensor& slice) const;
  // The all-gather's input of `flat` (whose shard is not a slice of its
  // gathered buffer). Made under the unsharded buffers' memory category.
  virtual GatherInput fetch(const FlatParam& flat);

  // A unit's reduced (and, across replicas, averaged) gradient shard, on
  // the unit's device in the reduce dtype: becomes (or adds to) the
  // shard's .grad, possibly after a copy left in flight.
  virtual void accept_gradient(FlatParam& flat, torch::Tensor reduced);
  // A gradient accept_gradient left in flight, and its completion.
  virtual bool gradient_pending(const FlatParam& flat) const { return false; }
  virtual void finish_gradient(FlatParam& flat) {}
  // The end of backward, before the optimizer touches the shards.
  virtual void finish_backward() {}
  // The coming backward is the last of a step. A placement that can take
  // each unit's gradient as it is reduced (accept_gradient) and free it at
  // once returns true and does so, updating units through `stepper`:
  // - a step that needs no gradient first (`preparation` asks nothing):
  //   each unit steps at once; step() then steps only what that left;
  // - a step that unscales or clips: each gradient is prepared as it
  //   arrives (prepare_gradient: its figures on its FlatParam, read by
  //   clipping and the loss scaler) and kept out of memory; step() then
  //   defers each unit's update, with the clip coefficient clipping left
  //   on its figures, to just before its next all-gather (or whatever
  //   brings it into memory first).
  // The numbers are those of the step after backward, bit for bit.
  virtual bool begin_step_in_backward(std::shared_ptr<const UnitStepper> stepper, const StepPreparation& preparation) {
    return false;
  }
  // Every update step() left pending applied now (before something reads
  // the state as a whole: a checkpoint's metadata, its step counts).
  virtual void apply_pending_updates() {}

  // The optimizer step over the model's shards (see UnitStepper): after
  // the decoupled decay of their matrices at their group's lr.
  virtual void step(FsdpState& state, const UnitStepper& stepper);

  // `flat`'s shard (and, with `stepper`, its optimizer state) brought into
  // memory (`resident`), and back where it lives: what changed in between
  // is kept. Blocking; ResidentScope calls it.
  virtual void set_resident(const FlatParam& flat, const UnitStepper* stepper, bool resident) {}

  // What the disk offload is and its traffic since the model was built, or
  // nothing without one.
  virtual std::optional<NvmeOffloadInfo> nvme_info() const { return std::nullopt; }
};

// How the engine gets a model's placement without naming one: the floor
// above (src/offload/placements.cpp) hands it these when it builds a
// FsdpState. `check` refuses, naming the setting, what no placement can do
// with the options on `device`, before anything is touched; `make` returns
// the placement the options ask for, once they passed `check`.
struct PlacementChoice {
  void (*check)(const FullyShardOptions& options, c10::Device device);
  std::unique_ptr<ShardOffload> (*make)(const FullyShardOptions& options, const DeviceContext& context);
};

}  // namespace fsdp::offload

namespace fsdp {

// What every reader (and loader) of a model's state between steps calls
// first, state dicts and checkpoints alike: the model must be idle (no unit
// gathered, no reduction in flight: FsdpState::check_idle), and any update a
// placement deferred to a unit's next use (disk offload's step before the
// next gather) is applied, so that what is read (a unit's values, the
// optimizer's step counts) is the last step's. The one place that flushes.
void settle_between_steps(const FsdpState& state);

// One buffer's shard (detail::flat_params()), and with `optimizer` its
// optimizer state, in memory for the scope's life (nothing to do where they
// never leave it): checkpoints and state dicts read and write them inside
// one, a buffer at a time. What the
// scope changed is kept when it ends. With `agree` the entry is collective
// over the model's group: a rank that cannot bring its state in makes every
// rank throw (for callers that gather inside the scope).
class ResidentScope {
 public:
  ResidentScope(const FsdpState& state, const FlatParam& flat, torch::optim::Optimizer* optimizer = nullptr,
                bool agree = false);
  ~ResidentScope() noexcept(false);
  ResidentScope(const ResidentScope&) = delete;
  ResidentScope& operator=(const ResidentScope&) = delete;

 private:
  offload::ShardOffload& offload_;
  const FlatParam& flat_;
  std::optional<UnitStepper> stepper_;  // with an optimizer: its state tensors
  int uncaught_ = 0;
};

}  // namespace fsdp
