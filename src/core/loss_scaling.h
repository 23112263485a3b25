#pragma once
// Whether a step scales its loss: the rule TrainStep (fsdp/train_step.h), the
// disk offload's schedule and the trainer's plan share.

#include "fsdp/train_step.h"

namespace fsdp {

/// Whether a TrainStep with `options` over a model of `mixed_precision`
/// scales the loss: TrainStepOptions::loss_scaling, else whether the
/// parameters or the reductions are fp16.
bool scales_loss(const TrainStepOptions& options, const MixedPrecision& mixed_precision);

}  // namespace fsdp
