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
#include "fsdp/safetensors.h"

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

// A saved sharded checkpoint, opened without any process group: its
// metadata, every file's checksum verified on opening, and any range of a
// unit's saved flat state ("param", "exp_avg", "exp_avg_sq") across shards.
class SavedCheckpoint {
 public:
  explicit SavedCheckpoint(const std::string& path);  // throws naming the problem file
  ~SavedCheckpoint();
  const nlohmann::json& metadata() const { return metadata_; }
  int64_t shards() const;
  // Copies elements [from, to) of unit `unit`'s flat `what` into `out`.
  void read_range(size_t unit, const std::string& what, int64_t from, int64_t to, const torch::Tensor& out) const;

 private:
  std::string path_;
  nlohmann::json metadata_;
  std::vector<std::unique_ptr<safetensors::Reader>> readers_;
};

// Offline: the fp32 weights of a sharded checkpoint as one safetensors file
// under the model's parameter names (one unit in memory at a time).
void convert_sharded_to_full(const std::string& checkpoint, const std::string& output);

// The newest complete checkpoint under dir ("" if there is none).
std::string latest_checkpoint(const std::string& dir);

// Removes all but the newest `keep` complete checkpoints and any unfinished
// ones older than the newest complete (call on one rank).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace fsdp
