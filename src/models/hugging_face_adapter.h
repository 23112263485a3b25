#pragma once
// One model family's mapping to and from Hugging Face's files (after
// torchtitan's per-model state_dict_adapter): config.json both ways, the
// parameter names, the layouts that differ, a tied head. The family-neutral
// reading and writing of folders (fsdp/hugging_face.h,
// src/state_dict/hugging_face.cpp) asks the adapter of the model's kind.
// Adding a family adds one adapter file beside its model, and one line to
// adapters() (hugging_face_adapter.cpp).

#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "base/strings.h"
#include "fsdp/model_config.h"
#include "fsdp/safetensors.h"

namespace fsdp::hugging_face::detail {

class Adapter {
 public:
  virtual ~Adapter() = default;
  /// The family it maps.
  virtual models::ModelKind kind() const = 0;
  /// The config.json "model_type" values it reads ("gpt2"; "llama").
  virtual std::vector<std::string> model_types() const = 0;
  /// The model's configuration from config.json at `path`; throws, naming
  /// the file and the field, for what the model does not do. A setting read
  /// and ignored (a dropout rate) is said in `ignored`, one sentence each.
  virtual models::ModelConfig read_config(const nlohmann::json& config, const std::string& path,
                                          std::vector<std::string>& ignored) const = 0;
  /// config.json's fields for `config`.
  virtual nlohmann::json config_json(const models::ModelConfig& config) const = 0;
  /// The model's parameters and their shapes, in named_parameters() order
  /// (a tied one once, under its first name), without building it.
  virtual std::vector<safetensors::TensorSpec> parameter_specs(const models::ModelConfig& config) const = 0;
  /// The Hugging Face name of one of the model's parameters.
  virtual std::string to_hf_name(const std::string& name) const { return name; }
  /// The model's name of a tensor in a Hugging Face file; std::nullopt for
  /// one the model does not keep (a buffer, a tied head).
  virtual std::optional<std::string> from_hf_name(const models::ModelConfig& config,
                                                  const std::string& hf_name) const = 0;
  /// Whether Hugging Face stores the parameter transposed (GPT-2's Conv1D).
  virtual bool is_transposed(const std::string& /*name*/) const { return false; }
  /// Whether the parameter is a head tied to the embedding, left out of Hugging Face's files.
  virtual bool is_tied_head(const models::ModelConfig& /*config*/, const std::string& /*name*/) const { return false; }
};

/// The adapter of each family, in ModelKind's order.
const std::vector<const Adapter*>& adapters();
/// The adapter of `kind`.
const Adapter& adapter(models::ModelKind kind);
/// The adapter that reads config.json's "model_type"; nullptr if none does.
const Adapter* adapter_for_model_type(const std::string& model_type);
/// Every model_type some adapter reads: "gpt2 or llama".
std::string known_model_types();

/// The adapters of the families (each in its own file).
const Adapter& gpt2_adapter();
const Adapter& llama_adapter();

/// A field of config.json, with its default when absent or null (transformers'
/// own defaults); throws, naming the file and the field, for a missing field
/// without one, a value of the wrong type, or a count that is not a whole
/// number that fits.
template <typename T>
T field(const nlohmann::json& config, const std::string& path, const char* name,
        std::optional<T> fallback = std::nullopt) {
  if (!config.contains(name) || config.at(name).is_null()) {
    TORCH_CHECK(fallback, "'", path, "' has no \"", name, "\"");
    return *fallback;
  }
  const nlohmann::json& value = config.at(name);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann converts a float (2.2e92) or a too-large unsigned to an integer
    // unchecked: a count must be written as a whole number that fits.
    TORCH_CHECK(value.is_number_integer() &&
                    (!value.is_number_unsigned() ||
                     value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())) &&
                    (value.is_number_unsigned() || (value.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                                    value.get<int64_t>() <= std::numeric_limits<T>::max())),
                "'", path, "': \"", name, "\" is ", value.dump(), ", expected a whole number that fits in ",
                8 * sizeof(T), " bits");
  }
  try {
    return value.get<T>();
  } catch (const std::exception&) {
    TORCH_CHECK(false, "'", path, "': \"", name, "\" is ", value.dump(), ", of the wrong type");
    throw;
  }
}

/// Dropout the models do not have: a non-zero rate is read, and said to be
/// ignored in `ignored` (GPT-2's own config.json sets 0.1 for each), not refused.
void note_ignored_dropout(const nlohmann::json& config, const std::string& path,
                          std::initializer_list<const char*> names, std::vector<std::string>& ignored);

}  // namespace fsdp::hugging_face::detail
