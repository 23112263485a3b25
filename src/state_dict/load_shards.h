#pragma once
// Filling a sharded model's shards from any source of whole tensors, each rank
// reading only its own elements: what loading Hugging Face weights, PEFT
// adapters and full checkpoints share.

#include "fsdp/state_dict.h"

namespace fsdp {

/// Reads `out.numel()` elements of the parameter `name`, flattened
/// (row-major), from element `offset` on, into `out` (1-D, fp32, CPU).
using ParameterReader = std::function<void(const std::string& name, int64_t offset, torch::Tensor& out)>;

/// Which parameters a load fills, by name (null: all of them).
using ParameterFilter = std::function<bool(const std::string& name)>;

/// Each rank fills its own shard of every parameter from `read`, asking it
/// only for the elements that the shard holds: a loader of files reads a
/// rank's pieces straight from the disk, and no rank holds the whole model
/// (hugging_face::load_weights). With `only`, just the parameters it accepts
/// are read; the others keep their values (a base model's weights from one
/// folder, its LoRA adapters from another). No communication; the caller
/// checks the names and shapes first.
void load_shards(FsdpState& state, const ParameterReader& read, const ParameterFilter& only = nullptr);

}  // namespace fsdp
