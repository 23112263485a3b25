#pragma once
// What the Hugging Face reading and writing (fsdp/hugging_face.h) shares with
// the PEFT files and the tools: the parameters' names and layouts in the hub's
// files, a folder's config and stored dtype, its weights checked against a
// configuration, save_pretrained's sizes, and the conversions fsdp-ckpt runs.

#include "fsdp/hugging_face.h"

namespace fsdp::hugging_face {

/// The dtype the model's weights are stored in (every tensor's; float32
/// where they differ): what a fine-tuned export is written in by default.
torch::ScalarType stored_dtype(const ModelFiles& files);

/// The config.json of the Hugging Face model at `path`: its folder, its
/// model.safetensors or the config.json itself (all a planner reads: the
/// weights need not be there); throws naming what is missing.
std::string find_config(const std::string& path);

/// The Hugging Face name of one of the model's parameters.
std::string to_hf_name(const models::ModelConfig& config, const std::string& name);

/// The model's name of a tensor of a Hugging Face file; std::nullopt for the
/// ones the model does not keep (GPT-2's attention mask buffers, its tied
/// lm_head.weight).
std::optional<std::string> from_hf_name(const models::ModelConfig& config, const std::string& hf_name);

/// Whether the parameter is stored transposed in Hugging Face files (GPT-2's Conv1D weights).
bool is_transposed(const models::ModelConfig& config, const std::string& name);

/// Checks a Hugging Face model's files against its configuration, from
/// their headers alone: every tensor the configuration implies there with
/// its shape and a float dtype, none it does not. Before anything is built:
/// a config.json that lies about the model's size is refused naming the
/// tensor, not allocated. Throws naming the file and the tensor.
void check_weights(const ModelFiles& files, const models::ModelConfig& config);

/// A byte count as save_pretrained's max_shard_size writes it: "5GB",
/// "500MB", "100KB" (powers of 1000), "2GiB", "512MiB" (of 1024), or a
/// number of bytes; throws naming the text otherwise.
int64_t parse_size(const std::string& text);

/// Whether `path` is a Hugging Face model: a folder holding config.json, or a
/// .safetensors file with config.json beside it (find_model says what is wrong with it).
bool is_model(const std::string& path);

/// config.json for `config` (the fields `transformers` reads, over those of
/// its source_json), for weights stored in `dtype`, as JSON text.
std::string config_json(const HubConfig& config, torch::ScalarType dtype = torch::kFloat);

/// The tokenizer and chat template files of a Hugging Face folder
/// (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
/// chat_template.jinja, generation_config.json, tokenizer.model, ...) copied
/// into another, those it has; returns their names.
std::vector<std::string> copy_tokenizer_files(const std::string& from_folder, const std::string& to_folder);

/// A model file of the spec's names (fsdp-train --save-final, fsdp-ckpt
/// convert) as a Hugging Face folder, one tensor in memory at a time.
void convert_file_to_hf(const std::string& spec_file, const HubConfig& config, const std::string& folder,
                        SaveOptions options = SaveOptions());

/// A checkpoint (either format) as a Hugging Face folder, one unit in memory at a time.
void convert_checkpoint_to_hf(const std::string& checkpoint, const HubConfig& config, const std::string& folder,
                              SaveOptions options = SaveOptions());

/// A Hugging Face model as one safetensors file of the spec's names and
/// layout (fp32), one tensor in memory at a time; its metadata carries the
/// configuration ("model": enum_name of its ModelKind, "config":
/// models::ModelConfig::describe()).
void convert_hf_to_file(const std::string& hf_path, const std::string& spec_file);

}  // namespace fsdp::hugging_face
