#pragma once
// Full state dicts as safetensors files, under the model's own parameter
// names (tied parameters once, under their first name).

#include <map>
#include <string>

#include "fsdp/fully_shard.h"

namespace fsdp {

// Loads a file into an unsharded module (call before fully_shard). Every
// parameter must be in the file with its exact shape, and the file may hold
// nothing else; float files of another precision are converted. Throws
// naming the file and the tensor; the module is changed only if all is well.
void load_full_weights(torch::nn::Module& module, const std::string& path);

// Collective over the model's group: gathers one unit at a time and rank 0
// streams it into `path` (written under a temporary name, renamed when
// complete), so no rank ever holds more than one unit unsharded.
void save_full_weights(FsdpState& state, const std::string& path,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace fsdp
