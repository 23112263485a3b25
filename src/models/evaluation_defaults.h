#pragma once
// The trainer's default evaluation set (fsdp/evaluation.h).

#include "fsdp/evaluation.h"

namespace fsdp {

/// The default E: 64 rounded up to a multiple of the world size.
int64_t default_evaluation_sequences(int world_size);

}  // namespace fsdp
