#pragma once
/// \file
/// Hugging Face model folders in and out: config.json read into the model's
/// configuration, parameter names mapped both ways, GPT-2's Conv1D weights
/// transposed, and model.safetensors written one tensor at a time.
///
/// A Hugging Face model is a folder holding config.json and model.safetensors
/// (what `save_pretrained` writes and the hub serves), or the shards that its
/// model.safetensors.index.json names (the hub's form of every large model),
/// or a model.safetensors file with config.json beside it.
///
/// Each model family (models::ModelKind) has one adapter beside its model
/// (src/models/*_hugging_face.cpp) that maps its config.json, its names and
/// its layouts:
/// - GPT-2 (GPT2LMHeadModel): the spec's GPT has GPT-2's names, under the
///   `transformer.` prefix (files downloaded from the hub name them without
///   it: both are read); GPT-2's Conv1D layers keep their weights as
///   [in, out], the spec's Linear as [out, in]; the head is tied to the token
///   embedding, so model.safetensors holds no lm_head.weight.
/// - Llama (LlamaForCausalLM) and the families that are a Llama with
///   switches (Mistral, Qwen2, Qwen3, Phi-3): the model (llama.h) has Hugging
///   Face's names and layout already.
///
/// Folders are written as transformers' save_pretrained writes them: in a
/// chosen dtype (the source's, for a fine-tuned download), in shards of at
/// most SaveOptions::max_shard_bytes with model.safetensors.index.json, and
/// streamed: from a sharded model, one unit gathered at a time
/// (save_full_weights with a FolderWriter).

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/model_config.h"
#include "fsdp/safetensors.h"
#include "fsdp/state_dict.h"

namespace fsdp::hugging_face {

/// A Hugging Face model's files.
struct ModelFiles {
  /// The safetensors files of the weights: model.safetensors, or each shard
  /// that a sharded folder's model.safetensors.index.json names, in order.
  std::vector<std::string> weights;
  std::string config;  ///< the config.json beside them
  std::string index;   ///< a sharded folder's model.safetensors.index.json ("" for one file)
  /// The weights' bytes, every file together.
  int64_t weight_bytes() const;
};

/// The files of the Hugging Face model at `path` (a folder, sharded or not,
/// or its model.safetensors); throws naming what is missing, or an index
/// that is not a weight map of files beside it.
ModelFiles find_model(const std::string& path);

/// What config.json describes.
struct HubConfig {
  models::ModelConfig model;  ///< the model's family and dimensions (the batch left at its default)
  /// The config.json this configuration was read from ("" if none): a saved
  /// folder's config.json keeps its other fields (token ids, ...) and a larger max_position_embeddings.
  std::string source_json;
  /// What config.json sets that the model does not do, and that is read and
  /// ignored rather than refused: a non-zero dropout rate (GPT-2's
  /// attn_pdrop, embd_pdrop, resid_pdrop; Llama's attention_dropout). One
  /// sentence each, naming the file and the field; fsdp-train prints them.
  std::vector<std::string> ignored;
};
/// Reads config.json; throws, naming the field, for an architecture or a
/// setting the model does not have (an activation other than GELU's tanh
/// form, untied embeddings, another LayerNorm epsilon, an inner width other
/// than 4x, rope scaling...).
HubConfig read_config(const std::string& config_path);

/// Loads a Hugging Face model's weights into a sharded model: each rank
/// reads only the elements of its own shards, straight from the files (a
/// tensor stored transposed, GPT-2's Conv1D, whole), so no rank ever holds
/// the whole model. The files are checked against the configuration first,
/// every tensor's name, shape and dtype; the model is changed only if all is
/// well. No communication.
void load_weights(FsdpState& state, const ModelFiles& files, const models::ModelConfig& config);

/// Loads a Hugging Face model's weights into an unsharded module built for
/// its configuration (before fully_shard), converting F32, BF16 or F16 to the
/// module's dtype. Every parameter must be in the file with its shape; a
/// tensor the model does not know is refused. Throws naming the file and the
/// tensor; the module is changed only if all is well.
void load_weights(torch::nn::Module& module, const ModelFiles& files, const models::ModelConfig& config);

/// How a Hugging Face folder is written (transformers' save_pretrained's
/// choices).
struct SaveOptions {
  SaveOptions() = default;
  /// The weights' dtype: float32, bfloat16 or float16 (config.json's "dtype" says it).
  TORCH_ARG(torch::ScalarType, dtype) = torch::kFloat;
  /// The largest shard, in bytes (save_pretrained's max_shard_size, 5 GB):
  /// weights beyond it go to model-00001-of-0000N.safetensors, ..., named
  /// by model.safetensors.index.json; a tensor larger than it has a shard of
  /// its own. Weights within it are one model.safetensors.
  TORCH_ARG(int64_t, max_shard_bytes) = 5'000'000'000;
};

/// A Hugging Face folder written as a stream: the model's tensors in, under
/// its own names and layout, in the order given; the safetensors files
/// (Hugging Face names and layout, SaveOptions' dtype and shards, metadata
/// {"format": "pt"}), the index when sharded, and config.json out.
/// config.json comes last: a folder that has it is complete. A writer
/// destroyed before commit() leaves no config.json.
class FolderWriter : public WeightWriter {
 public:
  /// Creates `folder` if need be, removes a config.json and an index it
  /// holds, and plans the shards for these tensors (the model's names;
  /// GPT-2's tied lm_head.weight, if listed, is skipped).
  FolderWriter(const std::string& folder, const HubConfig& config, const std::vector<safetensors::TensorSpec>& tensors,
               SaveOptions options = SaveOptions());
  /// Destroyed before commit() (a failed save): the folder is removed if
  /// this writer made it, so that nothing half-written is left behind.
  ~FolderWriter() override;
  /// The next tensor in the order given, under the model's layout (float),
  /// written in SaveOptions::dtype. Throws, naming the tensor, for a value
  /// that is not finite, or that SaveOptions::dtype's range would turn into
  /// inf (fp16 holds magnitudes up to 65504): nothing non-finite is written.
  void write(const torch::Tensor& tensor) override;
  /// After the last tensor: the last shard, the index, config.json; then
  /// removes the weight files of an earlier save that this one did not write.
  void commit() override;
  /// The weight files written, in order.
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string folder_;
  HubConfig config_;
  SaveOptions options_;
  std::vector<std::string> names_;  // the model's names, in order
  std::vector<size_t> shard_of_;    // per name: its shard (npos: left out, a tied head)
  std::vector<std::vector<safetensors::TensorSpec>> shards_;  // each shard's tensors (Hugging Face names, layout, dtype)
  std::vector<std::string> files_;  // each shard's file name
  size_t next_ = 0;
  size_t written_in_shard_ = 0;
  std::optional<safetensors::Writer> writer_;  // the shard being written
  bool made_folder_ = false;  // the folder did not exist before this writer
  bool committed_ = false;
};

}  // namespace fsdp::hugging_face
