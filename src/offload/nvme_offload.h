#pragma once
// Disk offload of a sharded model's state (DeepSpeed's ZeRO-Infinity): what
// FullyShardOptions::nvme_offload asks for, the model's ShardOffload (the
// seam in core/shard_offload.h). Not installed.
// Each rank keeps its offloaded tensors in one DiskStore (a scratch file in
// the offload folder), one slot per tensor per unit:
//   master      the fp32 shard (what the optimizer steps), when it is offloaded
//   compute     the shard in the param dtype (what the all-gather sends), when
//               the parameters are offloaded and that dtype is not fp32
//   exp_avg, exp_avg_sq   AdamW's moments, when the optimizer state is offloaded
// An offloaded tensor in memory has its full size; out of memory it has none
// (the fp32 shard keeps its identity, the optimizer's parameter, with empty
// data). Between steps everything offloaded is out. Three things bring it in:
// - the optimizer step, unit by unit (each update a UnitStepper's, from
//   core: this file names no optimizer), overlapping compute wherever the last
//   backward of a step hands each unit's gradient over as it is reduced
//   (begin_step_in_backward; NvmeOffloadOptions::step_in_backward):
//   - a step that needs no gradient first (no clipping, no loss scaling):
//     each unit's state is read when its backward gathers and stepped as
//     soon as its gradient is reduced (accept_gradient), which is then
//     freed, and written behind the next units' backward;
//   - a step that clips or scales the loss: each gradient is prepared as
//     it arrives (unscaled, its sum of squares kept for the norm), written
//     behind to the scratch file and freed; step() then leaves each
//     unit's update pending, with the clip coefficient and the group
//     options of that step, until the unit is next needed (its next
//     all-gather, a ResidentScope): its state and gradient are read ahead
//     in the order the units were gathered, stepped, and written behind;
//   otherwise after backward (step()), pipelined: the next unit's read
//   and the previous unit's write run while this unit steps;
// - an all-gather of offloaded parameters (the FlatParam's compute source),
//   the reads of the read_ahead units that came next in the last step
//   issued ahead (one unit deeper after a step in which compute waited on
//   the disk, up to max_read_ahead);
// - a ResidentScope, for checkpoints and state dicts, one unit at a time.
// A backward outside fsdp::TrainStep is refused: a user's own
// optimizer.step() could not bring the state in around each unit's update.

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <unordered_map>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "offload/disk_store.h"
#include "core/shard_offload.h"
#include "fsdp/options.h"

namespace fsdp {
class FsdpState;
}  // namespace fsdp

namespace fsdp::offload {

// Refuses, naming the setting, what nvme_offload cannot do with these
// options (before fully_shard touches a parameter).
void check_nvme_offload_options(const FullyShardOptions& options, c10::Device device);

class NvmeOffload final : public ShardOffload {
 public:
  // The scratch file is made before the units are built (prepare()). The
  // options must have passed check_nvme_offload_options.
  explicit NvmeOffload(const FullyShardOptions& options);
  ~NvmeOffload() override;
  NvmeOffload(const NvmeOffload&) = delete;
  NvmeOffload& operator=(const NvmeOffload&) = delete;

  const char* where() const override { return "disk"; }
  // Creates this rank's scratch file (refused, naming the folder and the
  // bytes, where it has no room), a unit's slots after another's: a frozen
  // part's parameters only (no moments, no gradient).
  void prepare(FsdpState& state, const std::vector<ShardPlan>& shards) override;
  // Moves the unit's offloaded state to its slots, before the next unit is built.
  void unit_built(FlatParam& flat) override;
  // The all-gather's input read from disk (or from the param-dtype copy kept in memory).
  GatherInput fetch(const FlatParam& flat) override;
  bool begin_step_in_backward(std::shared_ptr<const UnitStepper> stepper, const StepPreparation& preparation) override;
  // Steps the unit at once, or prepares and writes out its gradient, when
  // begin_step_in_backward armed this backward.
  void accept_gradient(FlatParam& flat, torch::Tensor reduced) override;
  void apply_pending_updates() override { step_all_pending(); }
  // Waits for the writes the units stepped in backward left in flight.
  void finish_backward() override;
  // The optimizer step over every unit that has a gradient, pipelined: the
  // next unit's read and the previous unit's write run while this unit
  // steps; a unit whose gradient was prepared is left pending instead.
  void step(FsdpState& state, const UnitStepper& stepper) override;
  void set_resident(const FlatParam& flat, const UnitStepper* stepper, bool resident) override;
  OffloadStats stats() const;
  std::optional<NvmeOffloadInfo> nvme_info() const override;

  // Unit `unit`'s offloaded state in memory (stepper: null for the model's
  // tensors only; else the optimizer's moments too), and back on disk: what
  // a changed (or new) tensor holds is written first. Blocking.
  void bring_in(size_t unit, const UnitStepper* stepper);
  void send_out(size_t unit, const UnitStepper* stepper);

  bool offloads_master() const { return offload_master_; }
  bool offloads_optimizer_state() const { return options_.optimizer_state(); }
  bool offloads_params() const { return options_.params(); }
  const DiskStore& store() const { return *store_; }
  // The bytes of memory the offloaded state would take: what is on disk.
  int64_t offloaded_bytes() const { return static_cast<int64_t>(store_->file_bytes()); }

 private:
  struct UnitSlots;
  struct Moments;
  struct DeferredStep;
  using Futures = std::vector<std::shared_future<void>>;

  // What this placement keeps of a unit (UnitSlots, on its FlatParam: hung
  // there by unit_built()), by the unit's FlatParam or its position in detail::units().
  static UnitSlots& slots_of(const FlatParam& flat);
  UnitSlots& unit_slots(size_t unit) const;
  size_t num_units() const;

  // The optimizer's moments of `unit` when it has state for its shard.
  std::optional<Moments> moments_of(size_t unit, const UnitStepper* stepper) const;
  // Issues the reads of whatever of `unit` is offloaded and out of memory,
  // into fresh memory; the tensors have their full size at once.
  Futures issue_reads(size_t unit, const UnitStepper* stepper);
  void issue_reads_into(size_t unit, const UnitStepper* stepper, Futures& futures);
  // Drops the parameter read issued ahead (waiting for it first).
  void discard_read_ahead() noexcept;
  // Issues the writes of what is in memory and must go to disk (everything,
  // or only the changed and the new); free_unit() then frees it.
  Futures issue_writes(size_t unit, const UnitStepper* stepper, bool only_changed);
  void free_unit(size_t unit, const UnitStepper* stepper);
  void wait(Futures& futures);
  // Waits without throwing (unwinding): memory the store still uses must outlive it.
  static void drain(Futures& futures) noexcept;
  // The all-gather's input of `unit` (its FlatParam's compute source).
  torch::Tensor compute_shard(size_t unit);
  Futures read_compute(size_t unit, torch::Tensor& into);
  // Issues the reads of the units that follow position `position` (`unit`)
  // of the last step's fetch order, up to read_ahead of them.
  void read_ahead_after(size_t position, size_t unit);
  // At each step's boundary: one unit deeper where compute waited on the
  // disk for deepen_above of the step (NvmeOffloadOptions::max_read_ahead).
  void adapt_read_ahead();
  // Step in backward: one unit, as its gradient arrived; and the writes
  // behind, retired (waited for, their memory freed) down to `keep` in
  // flight, or down to the last of `unit`'s (before its slots are read).
  void step_now(size_t unit);
  bool steps_in_backward() const { return backward_stepper_ && !preparing_; }
  // Issues the state reads of `unit` for its step in backward, once.
  void read_state(size_t unit);
  void retire_writes(size_t keep);
  void settle_writes(size_t unit);
  // Deferred step: a unit's gradient prepared and written out as it
  // arrived; the pending update of a unit (its state and gradient read,
  // ahead where issued: read_pending), applied and written behind; and
  // every pending update (before anything else needs the state).
  void write_out_gradient(size_t unit);
  void read_pending(size_t unit);
  void step_pending(size_t unit);
  void step_all_pending();
  // The updates of the units whose gradients were prepared, left pending
  // (null: none), with a stepper for later (UnitStepper::for_later).
  std::shared_ptr<DeferredStep> defer_step(const UnitStepper& stepper);

  FsdpState* state_ = nullptr;  // set by prepare()
  // Each unit's FlatParam, by index (set as it is built), and the slots
  // planned for the units not built yet.
  std::vector<FlatParam*> flats_;
  std::vector<std::unique_ptr<UnitSlots>> planned_;
  NvmeOffloadOptions options_;
  bool offload_master_ = false;
  torch::ScalarType param_dtype_ = torch::kFloat;
  std::unique_ptr<DiskStore> store_;
  std::atomic<int64_t> wait_ns_{0};
  int64_t steps_ = 0;  // optimizer steps taken through step()
  // The units read ahead now, and the last step boundary's time and wait (adapt_read_ahead).
  int read_ahead_ = 2;
  std::chrono::steady_clock::time_point last_step_at_ = std::chrono::steady_clock::now();
  int64_t wait_ns_at_last_step_ = 0;
  // Read-ahead of offloaded parameters: the order units were fetched in the
  // last step, where this step is in it, and the reads issued ahead, in
  // fetch order.
  struct Ahead {
    size_t unit = 0;
    size_t position = 0;  // in the last step's fetch order
    torch::Tensor values;
    Futures reads;
  };
  std::vector<size_t> fetch_order_last_, fetch_order_this_;
  std::deque<Ahead> ahead_;
  // Step in backward (begin_step_in_backward to finish_backward): the
  // stepper; each unit's state reads issued at its gather; the units
  // stepped, and their writes in flight, oldest first.
  std::shared_ptr<const UnitStepper> backward_stepper_;
  // The order gradients arrived in, in the last step and in this one: the
  // next units' state is read while this one steps and the next computes.
  std::vector<size_t> grad_order_last_, grad_order_this_;
  // Writes behind compute, oldest first: the unit (freed when they end),
  // the stepper whose optimizer's state they write, and a gradient they write from.
  struct WriteBehind {
    size_t unit = 0;
    std::shared_ptr<const UnitStepper> stepper;
    Futures writes;
    torch::Tensor source;
  };
  std::deque<WriteBehind> writes_behind_;
  // Deferred step: set from begin_step_in_backward to finish_backward when
  // this backward prepares the gradients; the order the pending units are
  // expected in (the last step's gather order) and the next of them.
  std::optional<StepPreparation> preparing_;
  std::vector<size_t> pending_order_;
  size_t pending_next_ = 0;
  bool writes_gradients_ = false;  // the store has a gradient slot per unit
  bool last_step_deferred_ = false;
  bool last_step_in_backward_ = false;
};

}  // namespace fsdp::offload

