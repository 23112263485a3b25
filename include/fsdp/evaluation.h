#pragma once
/// \file
/// Sharded evaluation: the mean loss over held-out sequences.
///
/// Sharded evaluation: the mean loss over E held-out sequences, split over
/// the W ranks (rank r takes sequences r * E/W ... (r + 1) * E/W - 1, in
/// forwards of at most a batch), so that every rank runs the same number of
/// forwards (the units' all-gathers) and the result is the mean over all E.

#include <torch/torch.h>

#include <functional>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/token_data.h"

namespace fsdp {

/// The model's mean loss over the rows of `inputs`, predicting `targets`
/// (for fsdp::models::GPT: model.forward(inputs, targets)).
using SequenceLoss = std::function<torch::Tensor(const torch::Tensor& inputs, const torch::Tensor& targets)>;

/// How many held-out sequences, in forwards of how many, on which device.
struct EvaluationOptions {
  /// E: a positive multiple of the world size.
  TORCH_ARG(int64_t, sequences) = 64;
  /// The most sequences a rank puts through one forward.
  TORCH_ARG(int64_t, batch) = 1;
  /// Where the model computes (the sequences are moved there).
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
};

/// Collective over `world` (and the model's units): the mean of `loss` over
/// the first E validation sequences of `data`, without gradients. `state` is
/// the sharded model's (checked idle afterwards: every unit resharded).
double evaluate_loss(FsdpState& state, const SequenceLoss& loss, const models::TokenData& data,
                     const ProcessGroupPtr& world, const EvaluationOptions& options);

/// Collective: the mean loss over the answer tokens (the targets that carry
/// loss) of the first min(E, val_rows) validation rows of `data`, each token
/// weighing alike whatever its row, without gradients. `summed_loss` is the
/// model's loss of packed rows summed over their targets (for a
/// LanguageModel: model.forward(b.inputs, b.targets,
/// SequencePacking::from_positions(b.positions), 1.0)). Each rank takes
/// ceil(rows / W) consecutive rows, blank ones past the last, so that every
/// rank runs as many forwards.
double evaluate_loss(FsdpState& state,
                     const std::function<torch::Tensor(const models::PackedBatch& batch)>& summed_loss,
                     const models::ConversationData& data,
                     const ProcessGroupPtr& world, const EvaluationOptions& options);

}  // namespace fsdp
