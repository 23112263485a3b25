// Sharded evaluation over the validation split of a token source.

#include "fsdp/evaluation.h"
#include "models/evaluation_defaults.h"

#include <algorithm>

namespace fsdp {

int64_t default_evaluation_sequences(int world_size) { return (64 + world_size - 1) / world_size * world_size; }

double evaluate_loss(FsdpState& state, const SequenceLoss& loss, const models::TokenData& data,
                     const ProcessGroupPtr& world, const EvaluationOptions& options) {
  const int64_t sequences = options.sequences(), W = world->size();
  TORCH_CHECK(sequences > 0 && sequences % W == 0, "evaluate_loss: the sequences must be a positive multiple of the ",
              "world size ", W, ", got ", sequences);
  TORCH_CHECK(options.batch() > 0, "evaluate_loss: the batch must be positive, got ", options.batch());
  torch::NoGradGuard no_grad;  // forward only: every unit reshards after it
  const int64_t per_rank = sequences / W;
  double sum = 0.0;
  for (int64_t first = 0; first < per_rank; first += options.batch()) {
    const int64_t rows = std::min(options.batch(), per_rank - first);
    auto [x, y] = data.val_batch(world->rank() * per_rank + first, rows);
    sum += loss(x.to(options.device()), y.to(options.device())).item<double>() * static_cast<double>(rows);
  }
  state.check_idle();
  torch::Tensor total = torch::tensor({sum}, torch::kDouble);
  world->all_reduce(total, ReduceOp::kSum)->wait();
  return total.item<double>() / static_cast<double>(sequences);
}

}  // namespace fsdp
