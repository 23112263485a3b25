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

double evaluate_loss(FsdpState& state,
                     const std::function<torch::Tensor(const models::PackedBatch& batch)>& summed_loss,
                     const models::ConversationData& data,
                     const ProcessGroupPtr& world, const EvaluationOptions& options) {
  const int64_t W = world->size(), rank = world->rank();
  TORCH_CHECK(options.sequences() > 0 && options.batch() > 0, "evaluate_loss: the sequences and the batch must be ",
              "positive, got ", options.sequences(), " and ", options.batch());
  torch::NoGradGuard no_grad;
  const int64_t rows = std::min(options.sequences(), data.val_rows());
  const int64_t per_rank = (rows + W - 1) / W;
  double sum = 0.0, targets = 0.0;
  for (int64_t first = 0; first < per_rank; first += options.batch()) {
    const int64_t count = std::min(options.batch(), per_rank - first), start = rank * per_rank + first;
    // Rows from `rows` on are blank (val_batch's past val_rows()).
    const int64_t real = std::clamp<int64_t>(rows - start, 0, count);
    models::PackedBatch batch = data.val_batch(real > 0 ? start : data.val_rows(), real > 0 ? real : count);
    if (real > 0 && real < count) {
      const models::PackedBatch blank = data.val_batch(data.val_rows(), count - real);
      batch.inputs = torch::cat({batch.inputs, blank.inputs});
      batch.targets = torch::cat({batch.targets, blank.targets});
      batch.positions = torch::cat({batch.positions, blank.positions});
    }
    batch.inputs = batch.inputs.to(options.device());
    batch.targets = batch.targets.to(options.device());
    batch.positions = batch.positions.to(options.device());
    sum += summed_loss(batch).item<double>();
    targets += static_cast<double>(batch.loss_targets);
  }
  state.check_idle();
  torch::Tensor total = torch::tensor({sum, targets}, torch::kDouble);
  world->all_reduce(total, ReduceOp::kSum)->wait();
  return total[0].item<double>() / total[1].item<double>();
}

}  // namespace fsdp
