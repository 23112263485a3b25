#pragma once
// The engine's parts of gradient clipping and matrix weight decay (not
// installed): the queued norm for gradients on a device, and the decay of
// one flat shard, for callers that hold it in memory only at times.

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "core/flat_param.h"
#include "fsdp/comm.h"

namespace fsdp {

namespace detail {
// The sum of a gradient's squares in double, in an order fixed by the
// element indices alone (what clip_grad_norm_ sums on the host).
double sum_of_squares_in_double(const torch::Tensor& grad);
// clip_grad_norm_tensor_ for gradients on a device (any device: the tests
// run it on the CPU): each gradient's norm in float, squared and summed in
// double, summed over `shard_group` (null: none), every gradient scaled by
// min(1, max_norm / (norm + 1e-6)).
torch::Tensor clip_gradients_queued(const std::vector<torch::Tensor>& grads, const ProcessGroupPtr& shard_group,
                                    double max_norm);
}  // namespace detail

// The element ranges [begin, end) of `flat`'s local shard that belong to
// parameters of 2 or more dimensions (what decay_matrix_weights_ decays).
std::vector<std::pair<int64_t, int64_t>> matrix_ranges_of_shard(const FlatParam& flat);
// One shard's part of decay_matrix_weights_: its matrices times (1 - lr x
// weight_decay). For a caller that has the shard in memory only at times
// (disk offload's step).
void decay_shard_matrices_(const FlatParam& flat, double lr, double weight_decay);

/// clip_grad_norm_ (fsdp/grad_utils.h), the norm as a 0-dimensional double tensor where the gradients
/// are: on a GPU nothing waits for it (the sums, the all-reduce and the
/// scaling are queued on the stream), so the host can queue the optimizer's
/// step behind them and read the norm afterwards (PyTorch returns a tensor
/// for the same reason).
torch::Tensor clip_grad_norm_tensor_(FsdpState& state, double max_norm);

/// Decoupled (AdamW's) weight decay of the parameters of 2 or more dimensions
/// only, not of biases and norm gains (the spec's and nanoGPT's rule):
/// p *= 1 - lr * weight_decay, lr being that of the shard's parameter group.
/// A flat shard mixes matrices with vectors, so the decay goes by the element
/// ranges the shard holds of each matrix. Call it right before the
/// optimizer's step, with the optimizer's own weight decay at 0: that is
/// torch AdamW with two parameter groups (decay on matrices, 0 on the rest).
/// Local: every rank decays its own shards.
void decay_matrix_weights_(FsdpState& state, torch::optim::Optimizer& optimizer, double weight_decay);

}  // namespace fsdp
