#pragma once
// The spec's mixing function (shared/spec/gpt.md): the shuffled data order's
// sequence starts.

#include "fsdp/token_data.h"

namespace fsdp::models {

/// The spec's splitmix64 (all arithmetic mod 2^64).
uint64_t splitmix64(uint64_t z);

}  // namespace fsdp::models
