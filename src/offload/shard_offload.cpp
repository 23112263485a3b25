// Where a model's shards live between uses: the in-memory placement (the
// interface's defaults), CPU offload's (pinned host memory, crossing to the
// device on the model's copy stream), the choice between them and disk
// offload, and ResidentScope over all three.

#include "offload/shard_offload.h"

#include <exception>
#include <iostream>
#include <vector>

#include "core/compat.h"
#include "core/device_context.h"
#include "core/unit.h"
#include "fsdp/grad_utils.h"
#include "fsdp/memory.h"
#include "offload/nvme_offload.h"

namespace fsdp::offload {

torch::Tensor ShardOffload::make_shard(const torch::Tensor& slice) const { return slice.clone(); }

GatherInput ShardOffload::fetch(const FlatParam& flat) {
  // The cast halves bf16 traffic.
  GatherInput input;
  input.values = flat.shard().detach().to(flat.device(), flat.config().mixed_precision.param_dtype(),
                                          /*non_blocking=*/true);
  return input;
}

void ShardOffload::accept_gradient(FlatParam& flat, torch::Tensor reduced) {
  TORCH_CHECK(reduced.device() == flat.shard().device(), "FlatParam: a shard in ", where(), " on ",
              flat.shard().device(), " got its reduced gradient on ", reduced.device());
  flat.accumulate_into_gradient(std::move(reduced));
}

void ShardOffload::step(FsdpState& state, torch::optim::Optimizer& optimizer, double matrix_weight_decay) {
  decay_matrix_weights_(state, optimizer, matrix_weight_decay);
  optimizer.step();
}

namespace {

// The shards in the units' own memory (the default).
class InMemory final : public ShardOffload {
 public:
  const char* where() const override { return "memory"; }
};

// CPU offload (FullyShardOptions::cpu_offload): the fp32 shards, their
// gradients and so the optimizer state in host memory, pinned when the units
// are on a GPU. There the shard crosses to the device on the copy stream
// before its gather, and the reduced gradient back after its reduction.
class CpuOffload final : public ShardOffload {
 public:
  explicit CpuOffload(const DeviceContext& context) : context_(context) {}
  const char* where() const override { return "pinned host memory"; }

  torch::Tensor make_shard(const torch::Tensor& slice) const override {
    // Pinned, so that the copies to and from the GPU are asynchronous.
    torch::Tensor shard = torch::empty(
        {slice.numel()}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(context_.device().is_cuda()));
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
    input.staging.copy_(flat.shard().detach(), /*non_blocking=*/true);
    if (!input.values.is_same(input.staging)) input.values.copy_(input.staging);
    return input;
  }

  void finish_local_gather(GatherInput& input) const override {
    if (!input.stream) return;
    c10::Event copied = context_.record_on_copy_stream();
    input.stream.reset();
    copied.block(context_.compute_stream());
    input.staging = torch::Tensor();
  }

  void accept_gradient(FlatParam& flat, torch::Tensor reduced) override {
    if (reduced.device() == flat.shard().device()) return ShardOffload::accept_gradient(flat, std::move(reduced));
    // The gradient shard goes to the host in fp32, on the copy stream, after
    // the compute stream's work so far (the reduction it waited for, the
    // cast); finish_gradient() waits for it.
    TORCH_CHECK(context_.has_copy_stream(), "FlatParam: an offloaded shard on ", flat.shard().device(),
                " with its gradient on ", reduced.device(), " needs the copy stream fully_shard makes for cpu_offload");
    if (gradient_pending(flat)) finish_gradient(flat);  // an earlier micro-step's
    torch::Tensor source = reduced.scalar_type() == torch::kFloat ? reduced : reduced.to(torch::kFloat);
    torch::Tensor host =
        torch::empty({flat.shard_numel()}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
    context_.copy_stream_waits_for_compute();
    {
      c10::StreamGuard on_copy_stream(context_.copy_stream());
      host.copy_(source, /*non_blocking=*/true);
    }
    pending_of(flat) = std::make_unique<PendingHostGradient>(
        PendingHostGradient{std::move(host), std::move(source), context_.record_on_copy_stream()});
  }

  bool gradient_pending(const FlatParam& flat) const override {
    return flat.unit_index() < pending_.size() && pending_[flat.unit_index()] != nullptr;
  }

  void finish_gradient(FlatParam& flat) override {
    TORCH_CHECK(gradient_pending(flat), "FlatParam: no gradient copy to the host in flight");
    std::unique_ptr<PendingHostGradient> pending = std::move(pending_of(flat));
    compat::synchronize_event(pending->copied);
    // The copy has read it: its block may go back to the compute stream's pool.
    pending->device.reset();
    torch::NoGradGuard no_grad;
    flat.accumulate_into_gradient(std::move(pending->host));
  }

  // The host steps the shards next, so no copy of them may still be
  // reading (an unused prefetch's) when it writes.
  void finish_backward() const override { context_.synchronize_copy_stream(); }

 private:
  // The reduced gradient on its way to pinned host memory on the copy
  // stream; the device copy stays alive until the event says the copy has read it.
  struct PendingHostGradient {
    torch::Tensor host, device;
    c10::Event copied;
  };
  std::unique_ptr<PendingHostGradient>& pending_of(const FlatParam& flat) {
    if (pending_.size() <= flat.unit_index()) pending_.resize(flat.unit_index() + 1);
    return pending_[flat.unit_index()];
  }

  const DeviceContext& context_;
  std::vector<std::unique_ptr<PendingHostGradient>> pending_;  // by unit index
};

}  // namespace

void check_offload_options(const FullyShardOptions& options, c10::Device device) {
  TORCH_CHECK(!options.cpu_offload() || !keeps_params_unsharded(options.strategy()),
              "fully_shard: cpu_offload needs a sharded strategy (full_shard, shard_grad_op, hybrid_shard or "
              "hybrid_shard_zero2); ",
              strategy_name(options.strategy()), " keeps whole parameters on every rank");
  check_nvme_offload_options(options, device);
}

std::unique_ptr<ShardOffload> make_shard_offload(const FullyShardOptions& options, const DeviceContext& context) {
  if (options.nvme_offload()) return std::make_unique<NvmeOffload>(options);
  if (options.cpu_offload()) return std::make_unique<CpuOffload>(context);
  return std::make_unique<InMemory>();
}

}  // namespace fsdp::offload

namespace fsdp {

ResidentScope::ResidentScope(const FsdpState& state, const Unit& unit, torch::optim::Optimizer* optimizer, bool agree)
    : offload_(state.offload()),
      flat_(unit.flat_param()),
      optimizer_(optimizer),
      uncaught_(std::uncaught_exceptions()) {
  if (offload_.keeps_state_in_memory()) return;
  if (!agree) {
    offload_.make_resident(flat_, optimizer_);
    return;
  }
  std::string error;
  try {
    offload_.make_resident(flat_, optimizer_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Collective callers gather inside the scope: a rank that failed must not
  // leave the others waiting in that gather.
  torch::Tensor failed = torch::tensor({error.empty() ? 0 : 1}, torch::kInt);
  state.group()->all_reduce(failed, ReduceOp::kSum)->wait();
  if (failed.item<int>() == 0) return;
  if (error.empty()) offload_.release(flat_, optimizer_);  // this rank's part back where it lives
  TORCH_CHECK(error.empty(), error);
  TORCH_CHECK(false, "another rank could not bring unit ", flat_.unit_index(),
              "'s offloaded state into memory (its error says why)");
}

ResidentScope::~ResidentScope() noexcept(false) {
  if (offload_.keeps_state_in_memory()) return;
  if (std::uncaught_exceptions() > uncaught_) {
    // Unwinding: what the scope changed may be half done; try to leave the
    // state where it lives without adding an error to the one in flight.
    try {
      offload_.release(flat_, optimizer_);
    } catch (const std::exception& e) {
      std::cerr << "fsdp: returning unit " << flat_.unit_index() << "'s offloaded state to " << offload_.where()
                << " failed: " << e.what() << "\n";
    }
    return;
  }
  offload_.release(flat_, optimizer_);
}

}  // namespace fsdp
