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

// Collective over the model's group: the full state dict, gathered one unit
// (and one kind of state) at a time and streamed by rank 0, so no rank ever
// holds more than one unit unsharded.
//  - `model_path`: every parameter's fp32 master under the model's names;
//  - `optimizer_path`, when `optimizer` is given: AdamW's moments under
//    optimizer_tensor_name(), the step count in the metadata ("adamw_step").
// Each file is written under a temporary name, flushed and renamed when
// complete, and carries its checksum; on any failure nothing is left.
void save_full_state_dict(FsdpState& state, const std::string& model_path,
                          const std::map<std::string, std::string>& metadata = {},
                          torch::optim::AdamW* optimizer = nullptr, const std::string& optimizer_path = "");

// The name of a parameter's AdamW moment ("exp_avg", "exp_avg_sq") in a
// full optimizer file: "<param>.<moment>".
std::string optimizer_tensor_name(const std::string& param, const std::string& moment);

// The AdamW state of one shard (zeros if the optimizer has not stepped yet).
torch::optim::AdamWParamState& adamw_state(torch::optim::AdamW& optimizer, const torch::Tensor& shard);

// For tests of crash safety: kills this process (SIGKILL) if the
// environment says FSDP_TEST_KILL_IN_SAVE=<rank>:<n> and this is that rank's
// n-th save (full or sharded), after its first unit. Does nothing otherwise.
void maybe_kill_for_test(int rank);

}  // namespace fsdp
