#pragma once
// fsdp-train's training: the model sharded, checkpoints resumed, the loop,
// and the end of the run.

#include "fsdp/comm.h"
#include "fsdp/preemption.h"
#include "train/options.h"
#include "train/setup.h"

namespace fsdp_train {

// Trains the prepared run; returns the process's exit status (0, or a
// preemption's fsdp_tools::kExitPreempted or kExitPreemptedUnsaved, tool_support.h).
int train(const TrainOptions& o, Run& run, const fsdp::ProcessGroupPtr& world, const fsdp::Preemption& preemption);

}  // namespace fsdp_train
