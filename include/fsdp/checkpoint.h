#pragma once
// Sharded checkpoints: every shard of the model's fp32 masters and of AdamW's
// state, one safetensors file per shard, plus metadata.json (layout,
// checksums, training position). They reload on another world size and
// strategy: each rank reads the flat ranges its new shards cover.
//
// A checkpoint appears only complete: it is written into DIR/step-N.tmp,
// every file flushed, and renamed to DIR/step-N by rank 0 once all are
// whole. A crash mid-save leaves the previous checkpoint untouched.

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

#include "fsdp/fully_shard.h"

namespace fsdp {

// Collective. Writes DIR/step-<step> and returns its path. `extra` is kept
// in the metadata (e.g. the trainer's configuration and loss scale).
// The optimizer must be torch::optim::AdamW over state.parameters().
std::string save_sharded_checkpoint(FsdpState& state, torch::optim::AdamW& optimizer, const std::string& dir,
                                    int64_t step, const nlohmann::json& extra = nlohmann::json::object());

// Collective. Loads a checkpoint written by save_sharded_checkpoint, on any
// world size and strategy, after verifying every file's checksum and that
// the model's units and parameters match. Returns its metadata.
nlohmann::json load_sharded_checkpoint(FsdpState& state, torch::optim::AdamW& optimizer, const std::string& path);

// The newest complete checkpoint under dir ("" if there is none).
std::string latest_checkpoint(const std::string& dir);

// Removes all but the newest `keep` complete checkpoints and any unfinished
// ones older than the newest complete (call on one rank).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace fsdp
