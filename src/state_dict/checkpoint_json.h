#pragma once
// The library's own view of a checkpoint's metadata.json, as nlohmann::json:
// for the library, its tools (fsdp-ckpt) and tests. The public API
// (fsdp/checkpoint.h) speaks of it only through CheckpointInfo and
// CheckpointExtra, so that users need no JSON library of ours.

#include <nlohmann/json.hpp>

#include <string>

#include "fsdp/checkpoint.h"

namespace fsdp {

// metadata.json parsed (SavedCheckpoint::metadata(), CheckpointEntry::metadata).
struct CheckpointMetadata {
  nlohmann::json json;
};

// Writes DIR/metadata.json (through a temporary file, flushed) with a
// checksum of its contents that SavedCheckpoint verifies.
void write_checkpoint_metadata(const std::string& dir, nlohmann::json metadata);

// The fields of CheckpointInfo, read from a metadata.json that passed the
// layout checks (SavedCheckpoint's).
CheckpointInfo checkpoint_info(const nlohmann::json& metadata, const std::string& path, CheckpointFormat format);

// CheckpointExtra as the JSON object metadata.json keeps (every value parsed;
// throws naming the key whose text is not JSON), and back.
nlohmann::json extra_to_json(const CheckpointExtra& extra);
CheckpointExtra extra_from_json(const nlohmann::json& extra);

}  // namespace fsdp
