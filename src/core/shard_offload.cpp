// The seam's own definitions (core/shard_offload.h): ShardOffload's
// defaults, which are the in-memory placement, and ResidentScope over any
// placement. The placements themselves live a floor up, in src/offload/.

#include "core/shard_offload.h"

#include <exception>
#include <iostream>
#include <string>
#include <utility>

#include "core/flat_param.h"
#include "core/fsdp_state_impl.h"
#include "fsdp/grad_utils.h"
#include "core/grad_utils_internal.h"

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

void ShardOffload::step(FsdpState& state, const UnitStepper& stepper) {
  decay_matrix_weights_(state, stepper.optimizer(), stepper.matrix_weight_decay());
  stepper.optimizer().step();
}

}  // namespace fsdp::offload

namespace fsdp {

void settle_between_steps(const FsdpState& state) {
  state.check_idle();
  detail::shard_offload(state).apply_pending_updates();
}

ResidentScope::ResidentScope(const FsdpState& state, const FlatParam& flat, torch::optim::Optimizer* optimizer,
                             bool agree)
    : offload_(detail::shard_offload(state)),
      flat_(flat),
      uncaught_(std::uncaught_exceptions()) {
  if (offload_.keeps_state_in_memory()) return;
  if (optimizer) stepper_.emplace(*optimizer);
  const UnitStepper* stepper = stepper_ ? &*stepper_ : nullptr;
  if (!agree) {
    offload_.set_resident(flat_, stepper, true);
    return;
  }
  std::string error;
  try {
    offload_.set_resident(flat_, stepper, true);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Collective callers gather inside the scope: a rank that failed must not
  // leave the others waiting in that gather.
  torch::Tensor failed = torch::tensor({error.empty() ? 0 : 1}, torch::kInt);
  state.group()->all_reduce(failed, ReduceOp::kSum)->wait();
  if (failed.item<int>() == 0) return;
  if (error.empty()) offload_.set_resident(flat_, stepper, false);  // this rank's part back where it lives
  TORCH_CHECK(error.empty(), error);
  TORCH_CHECK(false, "another rank could not bring unit ", flat_.index(),
              "'s offloaded state into memory (its error says why)");
}

ResidentScope::~ResidentScope() noexcept(false) {
  if (offload_.keeps_state_in_memory()) return;
  if (std::uncaught_exceptions() > uncaught_) {
    // Unwinding: what the scope changed may be half done; try to leave the
    // state where it lives without adding an error to the one in flight.
    try {
      offload_.set_resident(flat_, stepper_ ? &*stepper_ : nullptr, false);
    } catch (const std::exception& e) {
      std::cerr << "fsdp: returning unit " << flat_.index() << "'s offloaded state to " << offload_.where()
                << " failed: " << e.what() << "\n";
    }
    return;
  }
  offload_.set_resident(flat_, stepper_ ? &*stepper_ : nullptr, false);
}

}  // namespace fsdp
