// Where a model's shards live between uses: the in-memory placement (the
// interface's defaults, core/shard_offload.cpp), CPU offload's (pinned host
// memory, crossing to the device on the model's copy stream), the choice
// between them and disk offload, and FsdpState's constructor, which hands
// that choice to the engine.

#include "offload/placements.h"

#include <array>
#include <exception>
#include <optional>
#include <iostream>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/compat.h"
#include "base/device_context.h"
#include "core/fsdp_state_impl.h"
#include "core/flat_param.h"
#include "fsdp/grad_utils.h"
#include "fsdp/memory.h"
#include "offload/nvme_offload.h"
#include "base/memory_counters.h"
#include "core/strategy_rules.h"

namespace fsdp::offload {

namespace {

// The shards in the units' own memory (the default).
class InMemory final : public ShardOffload {
 public:
  const char* where() const override { return "memory"; }
};

// CPU offload (OffloadPolicy::cpu): the fp32 shards, their
// gradients and so the optimizer state in host memory, pinned when the units
// are on a GPU. There the shard crosses to the device on the copy stream
// before its gather, and the reduced gradient back after its reduction,
// into a pinned buffer of the unit's that is the shard's .grad (a gradient
// holding an earlier micro-step's sum gets the new one added instead). The
// host waits for those copies once, at the end of backward (before, it
// waited at every unit's reduction, and added each shard there): during it
// a device gradient goes back to the pool once the compute stream has
// waited (on the device) for the copy that read it, at the next unit's.
// Pinned blocks come from CUDA's host allocator, which the counting
// allocator does not see: they are counted here (memory::count_host_bytes).
class CpuOffload final : public ShardOffload {
 public:
  explicit CpuOffload(const DeviceContext& context) : context_(context) {}
  ~CpuOffload() override {
    for (size_t c = 0; c < memory::kNumCategories; ++c) {
      if (pinned_bytes_[c] != 0) memory::count_host_bytes(static_cast<memory::Category>(c), -pinned_bytes_[c]);
    }
  }
  const char* where() const override { return "pinned host memory"; }

  // The units, whose HostUnitState this placement reaches through them.
  void prepare(FsdpState& state, const std::vector<ShardPlan>& /*shards*/) override { state_ = &state; }

  torch::Tensor make_shard(const torch::Tensor& slice) const override {
    // Pinned, so that the copies to and from the GPU are asynchronous.
    torch::Tensor shard = pinned_if_device(slice.numel(), memory::Category::kParameterShard);
    shard.copy_(slice);
    return shard;
  }

  GatherInput fetch(const FlatParam& flat) override {
    if (!context_.has_copy_stream()) return ShardOffload::fetch(flat);
    // Both made on the compute stream, which frees them once the gather is
    // waited for; the copy stream waits for the compute stream's work so
    // far, so a block it reuses is no longer in use. The cast is on the
    // device (FSDP2's order): a host-side cast would be synchronous.
    const auto on_device = torch::TensorOptions().device(flat.device());
    const torch::ScalarType param_dtype = flat.config().mixed_precision.param_dtype();
    GatherInput input;
    input.staging = torch::empty({flat.shard_numel()}, on_device.dtype(torch::kFloat));
    input.values = param_dtype == torch::kFloat ? input.staging : torch::empty({flat.shard_numel()}, on_device.dtype(param_dtype));
    context_.copy_stream_waits_for_compute();
    input.stream = std::make_unique<c10::StreamGuard>(context_.copy_stream());
    // Copied into the buffer without a gather: the compute stream waits for the copy.
    input.finish_local = [this](GatherInput& copied_in) {
      c10::Event copied = context_.record_on_copy_stream();
      copied_in.stream.reset();
      copied.block(context_.compute_stream());
      copied_in.staging = torch::Tensor();
    };
    input.staging.copy_(flat.shard().detach(), /*non_blocking=*/true);
    if (!input.values.is_same(input.staging)) input.values.copy_(input.staging);
    return input;
  }


  void accept_gradient(FlatParam& flat, torch::Tensor reduced) override {
    if (reduced.device() == flat.shard().device()) return ShardOffload::accept_gradient(flat, std::move(reduced));
    // The gradient shard goes to the host in fp32, on the copy stream, after
    // the compute stream's work so far (the reduction it waited for, the
    // cast); finish_gradient() waits for it.
    TORCH_CHECK(context_.has_copy_stream(), "FlatParam: an offloaded shard on ", flat.shard().device(),
                " with its gradient on ", reduced.device(), " needs the copy stream fully_shard makes for OffloadPolicy::cpu()");
    if (gradient_pending(flat)) finish_gradient(flat);  // an earlier micro-step's
    release_copied_sources();
    auto pending = std::make_unique<PendingHostGradient>();
    pending->landing = landing_of(flat);
    pending->host = pending->landing == Landing::kAdd ? pinned_if_device(flat.shard_numel(), memory::Category::kGradientShard)
                                                      : gradient_buffer_of(flat);
    pending->device = reduced.scalar_type() == torch::kFloat ? reduced : reduced.to(torch::kFloat);
    context_.copy_stream_waits_for_compute();
    {
      c10::StreamGuard on_copy_stream(context_.copy_stream());
      pending->host.copy_(pending->device, /*non_blocking=*/true);
    }
    pending->copied = context_.record_on_copy_stream();
    state_of(flat).pending = std::move(pending);
  }

  bool gradient_pending(const FlatParam& flat) const override {
    return flat.offload_state() && state_of(flat).pending != nullptr;
  }

  void finish_gradient(FlatParam& flat) override {
    TORCH_CHECK(gradient_pending(flat), "FlatParam: no gradient copy to the host in flight");
    std::unique_ptr<PendingHostGradient> pending = std::move(state_of(flat).pending);
    compat::synchronize_event(*pending->copied);
    pending->device.reset();  // the copy has read it
    torch::NoGradGuard no_grad;
    switch (pending->landing) {
      case Landing::kBecomesGradient: flat.shard().mutable_grad() = pending->host; break;
      case Landing::kInGradient: break;
      case Landing::kAdd:
        flat.shard().mutable_grad().add_(pending->host);
        uncount(memory::Category::kGradientShard, static_cast<int64_t>(pending->host.nbytes()));
        break;
    }
  }


  // The host steps the shards next, so no copy of them may still be
  // reading (an unused prefetch's) when it writes.
  void finish_backward() override { context_.synchronize_copy_stream(); }

 private:
  // Where a reduced gradient lands on the host: in the unit's own pinned
  // buffer, which becomes the shard's gradient (it had none) or already is
  // it and holds zeros (FlatParam::gradient_zeroed_in_place()); or, where the gradient holds
  // an earlier micro-step's sum, in a buffer of its own, added at the end.
  enum class Landing { kBecomesGradient, kInGradient, kAdd };
  // The reduced gradient on its way to pinned host memory on the copy
  // stream; the device copy stays alive until its copy has read it.
  struct PendingHostGradient {
    Landing landing = Landing::kAdd;
    torch::Tensor host, device;
    std::optional<c10::Event> copied;
  };
  // What this placement keeps of a unit (on its FlatParam): its pinned
  // gradient buffer and the copy in flight.
  struct HostUnitState : UnitOffloadState {
    std::unique_ptr<PendingHostGradient> pending;
    torch::Tensor gradient_buffer;
  };
  static HostUnitState& state_of(const FlatParam& flat) {
    if (!flat.offload_state()) flat.set_offload_state(std::make_unique<HostUnitState>());
    return static_cast<HostUnitState&>(*flat.offload_state());
  }
  // Calls f on the state of every unit that has one (none before the units are built).
  template <class F>
  void for_each_unit_state(F f) {
    if (!state_) return;
    for (const FlatParam* flat : detail::flat_params(*state_)) {
      if (flat->offload_state()) f(state_of(*flat));
    }
  }

  Landing landing_of(const FlatParam& flat) {
    HostUnitState& unit = state_of(flat);
    // TrainStep zeroed it in place since the last one landed (only the
    // optimizer's shards: one it does not hold keeps its gradient, which
    // the next one adds to, as in memory; review of issue 25).
    const bool zeroed = std::exchange(flat.gradient_zeroed_in_place(), false);
    const torch::Tensor& grad = flat.shard().grad();
    if (!grad.defined()) return Landing::kBecomesGradient;
    if (zeroed && unit.gradient_buffer.defined() && grad.is_same(unit.gradient_buffer)) return Landing::kInGradient;
    return Landing::kAdd;
  }

  // The device gradients of the copies issued earlier go back to the
  // compute stream's pool without the host waiting: the compute stream
  // waits (on the device) for their copies first, which have had a unit's
  // backward to run in.
  void release_copied_sources() {
    for_each_unit_state([this](HostUnitState& unit) {
      if (!unit.pending || !unit.pending->device.defined()) return;
      unit.pending->copied->block(context_.compute_stream());
      unit.pending->device = torch::Tensor();
    });
  }

  // The unit's pinned gradient buffer: made once and kept (so the pinned
  // memory is the same every step and counted exactly), reused when a
  // gradient was dropped (zero_grad with set_to_none). Unless the dropped
  // gradient is still held elsewhere (the caller kept an earlier step's
  // .grad): the copy would overwrite that tensor under its holder, where in
  // memory a new gradient is made. Then the old buffer is left to its
  // holder, uncounted, and a new one made (review of issue 25: "a kept
  // .grad aliases the reused pinned buffer").
  const torch::Tensor& gradient_buffer_of(const FlatParam& flat) {
    torch::Tensor& buffer = state_of(flat).gradient_buffer;
    if (buffer.defined() && (buffer.use_count() > 1 || buffer.storage().use_count() > 1)) {
      uncount(memory::Category::kGradientShard, static_cast<int64_t>(buffer.nbytes()));
      buffer = torch::Tensor();
    }
    if (!buffer.defined()) buffer = pinned_if_device(flat.shard_numel(), memory::Category::kGradientShard);
    return buffer;
  }

  // fp32 host memory: pinned (and counted here) for a model on a device.
  torch::Tensor pinned_if_device(int64_t numel, memory::Category category) const {
    const bool pinned = context_.device().is_cuda();
    torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(pinned));
    if (pinned) {
      const int64_t bytes = static_cast<int64_t>(t.nbytes());
      memory::count_host_bytes(category, bytes);
      pinned_bytes_[static_cast<size_t>(category)] += bytes;
    }
    return t;
  }
  void uncount(memory::Category category, int64_t bytes) const {
    if (!context_.device().is_cuda()) return;
    memory::count_host_bytes(category, -bytes);
    pinned_bytes_[static_cast<size_t>(category)] -= bytes;
  }

  const DeviceContext& context_;
  FsdpState* state_ = nullptr;  // set by prepare()
  mutable std::array<int64_t, memory::kNumCategories> pinned_bytes_{};  // counted by count_host_bytes
};

}  // namespace

void check_offload_options(const FullyShardOptions& options, c10::Device device) {
  TORCH_CHECK(!options.offload().is_cpu() || !keeps_params_unsharded(options.strategy()),
              "fully_shard: OffloadPolicy::cpu() needs a sharded strategy (full_shard, shard_grad_op, hybrid_shard or "
              "hybrid_shard_zero2); ",
              fsdp::enum_name(options.strategy()), " keeps whole parameters on every rank");
  check_nvme_offload_options(options, device);
}

std::unique_ptr<ShardOffload> make_shard_offload(const FullyShardOptions& options, const DeviceContext& context) {
  if (options.offload().nvme_options()) return std::make_unique<NvmeOffload>(options);
  if (options.offload().is_cpu()) return std::make_unique<CpuOffload>(context);
  return std::make_unique<InMemory>();
}

}  // namespace fsdp::offload

namespace fsdp {

// Built here, the floor that knows every placement: the engine (core) is
// handed the choice of placement and never names one.
FsdpState::FsdpState(std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group, FullyShardOptions options)
    : impl_(std::make_unique<detail::FsdpStateImpl>(*this, std::move(module), std::move(group), std::move(options))) {
  impl_->build({&offload::check_offload_options, &offload::make_shard_offload});
}

}  // namespace fsdp
