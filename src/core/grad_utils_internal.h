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

}  // namespace fsdp
