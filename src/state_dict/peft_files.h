#pragma once
// The parts of PEFT's files (fsdp/peft.h) that its reading and writing share:
// a parameter's name in them, the tensors an adapter folder holds, and
// adapter_config.json's text.

#include "fsdp/peft.h"

namespace fsdp::peft {

/// adapter_config.json's text, with every key PEFT 0.21 writes (its defaults
/// for what LoRA here does not set), task_type CAUSAL_LM.
std::string adapter_config_json(const AdapterConfig& config);

/// PEFT's name of one of the model's adapter parameters.
std::string to_peft_name(const models::ModelConfig& model, const std::string& name);

/// The adapter parameters of `adapters` (lora::adapters of a model of this
/// configuration), each linear's A then B, with their shapes.
std::vector<safetensors::TensorSpec> adapter_specs(const models::ModelConfig& model,
                                                   const std::vector<lora::AdapterInfo>& adapters);

}  // namespace fsdp::peft
