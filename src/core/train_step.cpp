// The training step every loop needs, on top of fully_shard's hooks.

#include "fsdp/train_step.h"

#include <array>
#include <chrono>
#include <unordered_set>

#include "base/compat.h"
#include "base/device_context.h"
#include "optim/optimizer_state.h"
#include "fsdp/trace.h"
#include "core/shard_offload.h"
#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "core/unit_stepper.h"
#include "base/memory_counters.h"
#include "core/grad_utils_internal.h"
#include "core/strategy_rules.h"
#include "core/loss_scaling.h"

namespace fsdp {
namespace {

using Clock = std::chrono::steady_clock;
using memory::Category;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool uses_fp16(const MixedPrecision& mp) {
  return mp.param_dtype() == torch::kHalf || mp.effective_reduce_dtype() == torch::kHalf;
}

}  // namespace

bool scales_loss(const TrainStepOptions& options, const MixedPrecision& mixed_precision) {
  return options.loss_scaling().value_or(uses_fp16(mixed_precision));
}

namespace {

// The optimizer must step the shards and nothing else: a loop that built it
// over the module's own parameters (empty while sharded) would silently
// train nothing.
void check_optimizer_steps_the_shards(const FsdpState& state, const torch::optim::Optimizer& optimizer) {
  std::unordered_set<const c10::TensorImpl*> shards;
  for (const auto& shard : state.parameters()) shards.insert(shard.unsafeGetTensorImpl());
  size_t found = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      TORCH_CHECK(shards.count(param.unsafeGetTensorImpl()), "fsdp::TrainStep: the optimizer steps a tensor of shape ",
                  param.sizes(), " that is no shard of the model: build it over model.parameters() (the local "
                  "shards), not over the module's own parameters");
      ++found;
    }
  }
  TORCH_CHECK(found == shards.size(), "fsdp::TrainStep: the optimizer steps ", found, " of the model's ",
              shards.size(), " shards: build it over model.parameters()");
}

// The optimizer's own decay of its group, for the check that it does not
// decay on top of TrainStepOptions::weight_decay.
double own_weight_decay(torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) return o->weight_decay();
  return 0.0;
}

RankFigures figures_now(const FsdpState& state, torch::optim::Optimizer& optimizer) {
  const memory::Usage usage = memory::usage();
  RankFigures figures{usage.model_state(), usage.peak_total, usage.live(Category::kParameterShard),
                      usage.live(Category::kGradientShard), usage.live(Category::kOptimizerState)};
  if (!detail::device_context(state).on_host()) {
    figures.device_peak_bytes = memory::device_usage(state.device()).peak_allocated;
    figures.device_gathered_peak_bytes = memory::gathered_usage().peak;
    const OptimizerState optimizer_state(optimizer);
    auto on_device = [&](const torch::Tensor& t) {
      return t.defined() && t.device() == state.device() ? static_cast<int64_t>(t.nbytes()) : int64_t{0};
    };
    for (const auto& shard : state.parameters()) {
      figures.device_param_shard_bytes += on_device(shard);
      figures.device_grad_shard_bytes += on_device(shard.grad());
      if (!optimizer_state.has_state(shard)) continue;
      for (const auto& name : optimizer_state.tensor_names()) {
        figures.device_optimizer_state_bytes += on_device(optimizer_state.value(shard, name));
      }
    }
    figures.device_model_state_bytes =
        figures.device_param_shard_bytes + figures.device_grad_shard_bytes + figures.device_optimizer_state_bytes;
  }
  return figures;
}

std::vector<RankFigures> gather_figures(const ProcessGroupPtr& group, const RankFigures& mine) {
  auto fields = [](RankFigures& f) {
    return std::array<int64_t*, 11>{&f.model_state_bytes,         &f.peak_tensor_bytes,
                                    &f.param_shard_bytes,         &f.grad_shard_bytes,
                                    &f.optimizer_state_bytes,     &f.device_peak_bytes,
                                    &f.device_model_state_bytes,  &f.device_param_shard_bytes,
                                    &f.device_grad_shard_bytes,   &f.device_optimizer_state_bytes,
                                    &f.device_gathered_peak_bytes};
  };
  constexpr int64_t kFields = 11;
  RankFigures copy = mine;
  torch::Tensor local = torch::empty({kFields}, torch::kLong);
  for (int64_t k = 0; k < kFields; ++k) local[k] = *fields(copy)[k];
  torch::Tensor all = torch::empty({kFields * group->size()}, torch::kLong);
  group->all_gather(all, local)->wait();
  std::vector<RankFigures> per_rank(group->size());
  const int64_t* values = all.data_ptr<int64_t>();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (int64_t k = 0; k < kFields; ++k) *fields(per_rank[r])[k] = values[r * kFields + k];
  }
  return per_rank;
}

}  // namespace

TrainStep::TrainStep(FsdpState& state, torch::optim::Optimizer& optimizer, TrainStepOptions options)
    : state_(state), optimizer_(optimizer), options_(std::move(options)) {
  TORCH_CHECK(options_.micro_steps() >= 1, "fsdp::TrainStep: micro_steps must be at least 1, got ",
              options_.micro_steps());
  TORCH_CHECK(options_.clip_grad_norm() >= 0, "fsdp::TrainStep: clip_grad_norm must be >= 0 (0: off), got ",
              options_.clip_grad_norm());
  TORCH_CHECK(options_.weight_decay() >= 0, "fsdp::TrainStep: weight_decay must be >= 0 (0: off), got ",
              options_.weight_decay());
  OptimizerState{optimizer_};  // refuses, by name, an optimizer whose state cannot be sharded
  if (options_.weight_decay() > 0) {
    for (auto& group : optimizer_.param_groups()) {
      const double own = own_weight_decay(group.options());
      TORCH_CHECK(own == 0, "fsdp::TrainStep: weight_decay(", options_.weight_decay(), ") decays the matrices; the ",
                  "optimizer's own weight_decay must then be 0 (it would decay every tensor too), got ", own);
    }
  }
  check_optimizer_steps_the_shards(state_, optimizer_);
  if (!detail::shard_offload(state_).keeps_state_in_memory()) check_steps_unit_by_unit(optimizer_);  // disk offload
  if (scales_loss(options_, state_.options().mixed_precision())) {
    scaler_ = std::make_unique<GradScaler>(state_, options_.grad_scaler());
  }
  // Skipping the reduction on all but the last micro-step costs nothing
  // where gradients are kept whole anyway; elsewhere it keeps full-size
  // gradients between micro-steps, so it is asked for.
  skip_sync_ = options_.micro_steps() > 1 && (keeps_full_gradients(state_.options().strategy()) || options_.no_sync());
}

namespace {
// The disk offload's traffic so far (zeros without one).
offload::OffloadStats offload_stats(const offload::ShardOffload& offload) {
  const auto info = offload.nvme_info();
  return info ? info->stats : offload::OffloadStats();
}

// The step's share of the disk offload's figures: `now` less `before`.
void record_offload(StepResult& result, const offload::OffloadStats& before, const offload::OffloadStats& now) {
  result.offload_bytes_read = now.bytes_read - before.bytes_read;
  result.offload_bytes_written = now.bytes_written - before.bytes_written;
  result.offload_wait_s = now.wait_seconds - before.wait_seconds;
  result.offload_copy_s = now.copy_seconds - before.copy_seconds;
  result.offload_bytes_staged = now.bytes_staged - before.bytes_staged;
  result.offload_checksum_s = now.checksum_seconds - before.checksum_seconds;
  result.offload_disk_s = now.disk_seconds - before.disk_seconds;
  result.offload_read_ahead = before.read_ahead;  // what this step read at (its end may deepen it)
}

// The micro-steps' forwards and backwards (the gradient reduced on the last
// only, unless every micro-step syncs): the sum of their losses, each 1/A of
// its own so that the sum is the step's mean and the gradient that of the
// mean over the global batch.
torch::Tensor run_micro_steps(const TrainStep& step, const std::shared_ptr<const UnitStepper>& stepper,
                              const TrainStep::LossFn& loss_fn) {
  FsdpState& state = step.state();
  GradScaler* scaler = step.scaler();
  const int64_t A = step.options().micro_steps();
  torch::Tensor step_loss;  // on the loss's device: a GPU run does not wait for it until the step ends
  for (int64_t micro = 0; micro < A; ++micro) {
    state.set_requires_gradient_sync(!step.syncs_only_last_micro_step() || micro == A - 1);
    torch::Tensor loss = loss_fn(micro);
    TORCH_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(), "fsdp::TrainStep: the loss function ",
                "must return a scalar that requires grad (micro-step ", micro, ")");
    loss = loss / static_cast<double>(A);
    // The last backward may hand each unit's gradient to the placement as
    // it is reduced (disk offload: nothing waits in a phase of its own, no
    // gradient stays in memory): it steps the unit at once, or, where the
    // step unscales or clips first, prepares the gradient as
    // GradScaler::unscale_ and clip_grad_norm_ would and steps the unit
    // just before its next gather.
    if (micro == A - 1) {
      StepPreparation preparation;
      if (scaler) preparation.unscale = 1.0 / scaler->scale_factor();
      preparation.clips = step.options().clip_grad_norm() > 0;
      detail::shard_offload(state).begin_step_in_backward(stepper, preparation);
    }
    (scaler ? scaler->scale(loss) : loss).backward();
    const torch::Tensor micro_loss = loss.detach().to(torch::kDouble);
    step_loss = step_loss.defined() ? step_loss + micro_loss : micro_loss;
  }
  state.set_requires_gradient_sync(true);
  return step_loss;
}

// The optimizer's part: unscale, clip, then decay and step through the
// placement (a skipped fp16 step does neither); the gradient norm, read once
// the step is queued (see clip_grad_norm_tensor_), undefined without clipping.
torch::Tensor take_optimizer_step(const TrainStep& step, const UnitStepper& stepper, StepResult& result) {
  FsdpState& state = step.state();
  GradScaler* scaler = step.scaler();
  const double max_norm = step.options().clip_grad_norm();
  torch::Tensor grad_norm;
  trace::Span span("optimizer step", "optimizer");
  if (scaler) scaler->unscale_();  // before clipping, which needs the true gradients
  if (max_norm > 0) grad_norm = clip_grad_norm_tensor_(state, max_norm);
  memory::MemoryCategoryScope scope(Category::kOptimizerState);
  // The matrices' decay is part of the step (the offload's: with disk
  // offload a master is in memory only during its unit's step), so a
  // skipped step does not decay either (AdamW decays inside its step).
  const std::function<void()> take_step = [&] { detail::shard_offload(state).step(state, stepper); };
  if (scaler) {
    result.stepped = scaler->step(take_step);
    result.loss_scale = scaler->scale_factor();
  } else {
    take_step();
  }
  return grad_norm;
}

}  // namespace

double TrainStep::token_loss_divisor(int64_t global_targets) const {
  TORCH_CHECK(global_targets >= 1, "fsdp::TrainStep::token_loss_divisor: the global batch must have a target that ",
              "carries loss, got ", global_targets);
  return static_cast<double>(global_targets) /
         static_cast<double>(options_.micro_steps() * static_cast<int64_t>(state_.group()->size()));
}

StepResult TrainStep::operator()(const LossFn& loss_fn) {
  StepResult result;
  memory::reset_peaks();
  memory::reset_device_peaks(state_.device());
  state_.reset_comm_stats();
  offload::ShardOffload& offload = detail::shard_offload(state_);
  const offload::OffloadStats io_before = offload_stats(offload);
  // The backward passes below are this step's (a placement whose step
  // needs its own pipeline refuses any other).
  bool& in_train_step = detail::FsdpStateImpl::of(state_).in_train_step_;
  in_train_step = true;
  const std::shared_ptr<void> leave_step(nullptr, [&in_train_step](void*) { in_train_step = false; });
  const auto start = Clock::now();
  // The optimizer's update, whole or a unit at a time (as the placement schedules it).
  const auto stepper = std::make_shared<const UnitStepper>(optimizer_, options_.weight_decay());
  torch::Tensor step_loss = run_micro_steps(*this, stepper, loss_fn);
  const auto optimizer_start = Clock::now();
  const torch::Tensor grad_norm = take_optimizer_step(*this, *stepper, result);
  result.optimizer_s = seconds_since(optimizer_start);
  // Zeroed, not freed, alike on every LibTorch: the gradient shards are
  // model state (what the planner counts and the memory figures measure).
  compat::zero_grad_keeping_memory(optimizer_);
  for (const auto& unit : detail::units(state_)) {
    FlatParam& flat = unit->flat_param();
    flat.prepared_gradient().reset();  // a skipped step's
    // The next reduced gradient may land in it instead of adding to it
    // (CPU offload's pinned buffer): only the optimizer's shards were zeroed.
    if (stepper->steps(flat)) flat.gradient_zeroed_in_place() = true;
  }
  state_.check_idle();
  // On a device this waits for the device to pass the step's collective
  // waits (their timing events); the loss read below waits for all the
  // step's work, the optimizer's after them, so it costs no extra stall.
  result.comm = state_.comm_stats();
  // The loss of the step is the global-batch mean: the mean of the ranks' means.
  // On the host (which waits here for a GPU's queued work, the optimizer's
  // included, so step_s is the whole step): a small control collective.
  step_loss = step_loss.to(torch::kCPU).reshape({});
  state_.group()->all_reduce(step_loss, ReduceOp::kAvg)->wait();
  result.loss = step_loss.item<double>();
  if (grad_norm.defined()) result.grad_norm = grad_norm.item<double>();
  result.step_s = seconds_since(start);
  record_offload(result, io_before, offload_stats(offload));  // zeros where the shards never leave memory
  result.figures = figures_now(state_, optimizer_);
  if (options_.gather_rank_figures()) result.per_rank = gather_figures(state_.group(), result.figures);
  return result;
}

}  // namespace fsdp
