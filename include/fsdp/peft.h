#pragma once
/// \file
/// LoRA adapters (fsdp/lora.h) in and out of Hugging Face PEFT's folders:
/// adapter_config.json and adapter_model.safetensors, as
/// `PeftModel.save_pretrained` writes them and `PeftModel.from_pretrained`
/// reads them (PEFT 0.21), and a model's adapters merged into its weights.
///
/// PEFT names an adapter's tensors by the Hugging Face model's names under
/// `base_model.model.` (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`);
/// A is r x in and B out x r whatever the layer (GPT-2's Conv1D too: only
/// the base weight is stored transposed there, which fan_in_fan_out says).
///
/// Everything streams: an adapter file is written by save_full_weights with
/// an AdapterWriter (which keeps the adapters and drops the rest) and read
/// by each rank into its own shards (load_adapter); a merged model is written
/// through a MergingWriter in front of hugging_face::FolderWriter, one unit
/// gathered at a time.

#include <torch/torch.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/lora.h"
#include "fsdp/model_config.h"
#include "fsdp/safetensors.h"
#include "fsdp/state_dict.h"

namespace fsdp::peft {

/// What adapter_config.json says that the adapters need.
struct AdapterConfig {
  lora::LoraOptions lora;  ///< r, lora_alpha, lora_dropout, target_modules (the seed is not PEFT's)
  /// Whether the base layers keep their weights as [in, out] (GPT-2's Conv1D).
  bool fan_in_fan_out = false;
  /// The base model, as given (base_model_name_or_path; "" for null).
  std::string base_model;
};

/// The adapter settings of a model family: `options`' LoRA, fan_in_fan_out
/// from the family (true for GPT-2's Conv1D, false for a Llama).
AdapterConfig adapter_config(const models::ModelConfig& model, const lora::LoraOptions& options,
                             const std::string& base_model = "");

/// Reads FOLDER/adapter_config.json. Throws, naming the key, for what the
/// adapters here cannot do: another peft_type, use_dora, use_rslora, bias
/// other than "none", lora_bias, modules_to_save, a rank_pattern or
/// alpha_pattern, layers_to_transform, exclude_modules, target_parameters,
/// trainable_token_indices, layer_replication, aLoRA and the other LoRA
/// variants, an init_lora_weights that changes the base weights (PiSSA,
/// OLoRA, CorDA, LoftQ...), a regular expression for target_modules.
AdapterConfig read_adapter_config(const std::string& folder);

/// Loads FOLDER/adapter_model.safetensors into a sharded model's adapters:
/// each rank reads only the elements of its own shards; the other parameters
/// are left as they are. The file must hold every adapter of `adapters`
/// with its shape, and nothing else. No communication.
void load_adapter(FsdpState& state, const std::string& folder, const models::ModelConfig& model,
                  const std::vector<lora::AdapterInfo>& adapters);

/// A PEFT folder written as a stream (save_full_weights): of the model's
/// parameters in, only the adapters are kept, written under PEFT's names in
/// `dtype` to adapter_model.safetensors; adapter_config.json comes last.
class AdapterWriter : public WeightWriter {
 public:
  /// Creates `folder` if need be; `tensors` are the model's parameters in
  /// the order they will come (save_full_weights'), adapters among them.
  AdapterWriter(const std::string& folder, const models::ModelConfig& model, const AdapterConfig& config,
                const std::vector<safetensors::TensorSpec>& tensors, torch::ScalarType dtype = torch::kFloat);
  /// Destroyed before commit(): the folder is removed if this writer made it.
  ~AdapterWriter() override;
  /// The next parameter in the order given: written if it is an adapter's,
  /// else skipped. Throws, naming the tensor, for a value that is not finite
  /// or that `dtype` would turn into inf.
  void write(const torch::Tensor& tensor) override;
  /// After the last tensor: adapter_model.safetensors finished, then adapter_config.json.
  void commit() override;

 private:
  std::string folder_;
  AdapterConfig config_;
  torch::ScalarType dtype_;
  std::vector<bool> kept_;  // per tensor in: whether it is an adapter's
  std::vector<std::string> names_;  // per tensor in: its model name
  size_t next_ = 0;
  std::optional<safetensors::Writer> writer_;
  bool made_folder_ = false;
  bool committed_ = false;
};

/// The model's parameters without the adapters: what a MergingWriter passes on.
std::vector<safetensors::TensorSpec> without_adapters(const std::vector<safetensors::TensorSpec>& tensors);

/// A WeightWriter in front of another: the model's parameters in (adapters
/// included), each adapted linear's weight out as W + (alpha / r) B A, in
/// the model's layout, and no adapter. A linear's A, B and W arrive in any
/// order (a unit's adapters, then its frozen part); the tensors go out in
/// the order given, a weight held back with those after it until its
/// adapters are in.
class MergingWriter : public WeightWriter {
 public:
  /// `tensors`: what comes in; `inner` was opened for without_adapters(tensors).
  MergingWriter(const std::vector<safetensors::TensorSpec>& tensors, const std::vector<lora::AdapterInfo>& adapters,
                std::unique_ptr<WeightWriter> inner);
  /// The next tensor in the order given: passed on, merged into its
  /// linear's weight, or held until the rest of its linear arrives.
  void write(const torch::Tensor& tensor) override;
  /// After the last tensor: everything held passed on, then `inner`'s commit.
  void commit() override;

 private:
  /// A tensor written but not yet passed on: a base weight or an adapter
  /// waiting for the rest of its linear.
  struct Pending {
    std::string weight;  // an adapted linear's weight name ("" for a tensor passed on as it is)
    torch::Tensor value;
  };
  void flush();
  std::vector<std::string> names_;
  std::map<std::string, double> scaling_;  // adapted linear's weight name -> alpha / r
  std::map<std::string, torch::Tensor> down_, up_;  // by the linear's weight name, until merged
  std::deque<Pending> pending_;
  size_t next_ = 0;
  std::unique_ptr<WeightWriter> inner_;
};

}  // namespace fsdp::peft
