#pragma once
// What the checkpoint code's parts share: the files and tensors of a
// checkpoint's layout, metadata.json read and checked, and the collective
// error report. checkpoint_schema.cpp defines them; checkpoint_save.cpp and
// checkpoint_load.cpp use them. Not part of the API.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"

namespace fsdp::detail {

// The full format's two data files.
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";

// metadata.json's "format" for each format.
const char* format_tag(CheckpointFormat format);

// The sharded format's file of shard `shard_index`, and the name its tensor
// `what` ("param" or an optimizer state) of unit `unit` has there.
std::string shard_file(int64_t shard_index);
std::string tensor_name(size_t unit, const std::string& what);

// Flushes a file or folder to the disk (errors ignored).
void fsync_path(const std::filesystem::path& path);

// metadata.json's "units": every buffer's (detail::flat_params()) name,
// numel, shard_numel and parameters (name, shape, offset), as `state` lays
// them out; "frozen": true on a unit's frozen buffer (Unit::frozen_params(),
// named "<unit>#frozen"), absent elsewhere.
nlohmann::json unit_layout(const FsdpState& state);

// What a checkpoint holds of every unit: "param" (the fp32 master), then
// the optimizer's element-wise state tensors. Checkpoints from before other
// optimizers were supported hold AdamW's two moments and say nothing.
std::vector<std::string> state_names(const nlohmann::json& meta);
// What the checkpoint holds of unit `unit`: state_names(meta), or "param"
// alone for frozen parameters, which have no optimizer state.
std::vector<std::string> unit_state_names(const nlohmann::json& meta, size_t unit);

using FileSpecs = std::vector<std::pair<std::string, std::vector<safetensors::TensorSpec>>>;

// Every file a checkpoint with this metadata holds, and its tensors.
FileSpecs expected_files(const nlohmann::json& meta, CheckpointFormat format);

// The metadata.json of the checkpoint at `path`, checked without opening a
// data file: valid JSON, a known format, its own checksum matching, and a
// well-formed layout (check_layout).
nlohmann::json read_metadata(const std::string& path, CheckpointFormat* format);

// Collective: if any rank failed, every rank throws the message of the
// lowest failing rank, so that a job stopped by one rank's finding (a
// corrupt file only that rank read) prints it once rather than once per rank.
void throw_first_rank_error(const ProcessGroupPtr& group, const std::string& error);

}  // namespace fsdp::detail

namespace fsdp {

/// The name of a parameter's optimizer state tensor (such as "exp_avg") in a full
/// optimizer file: "<param>.<state>".
std::string optimizer_tensor_name(const std::string& param, const std::string& state_name);

/// One DIR/step-N (or DIR/step-N.tmp) of a checkpoint folder.
struct CheckpointEntry {
  std::string path;  ///< the directory
  int64_t step = -1;  ///< N, from the directory's name
  /// step-N with a metadata.json that parses, names a known format and
  /// matches its own checksum (the data files are not read: SavedCheckpoint
  /// verifies those).
  bool complete = false;
  CheckpointFormat format = CheckpointFormat::kSharded;  ///< when complete
  CheckpointInfo info;                                   ///< when complete
  std::shared_ptr<const CheckpointMetadata> metadata;    ///< when complete: metadata.json parsed
  std::string problem;                                   ///< why not complete
};

/// Every step-N and step-N.tmp directory under dir, newest step first (at
/// equal steps the complete one first); empty if dir holds none.
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

/// Removes all but the newest `keep` complete checkpoints and any unfinished
/// ones older than the newest complete (call on one rank).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace fsdp
