// LoRA adapters in and out of PEFT's folders, and merged into the weights
// (fsdp/peft.h). PEFT's own code is the spec: peft/tuners/lora/config.py
// (LoraConfig's keys and defaults), peft/utils/save_and_load.py (the names),
// peft/tuners/lora/layer.py (merge: W + scaling * B @ A).

#include "fsdp/peft.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "base/strings.h"
#include "fsdp/hugging_face.h"
#include "models/hugging_face_adapter.h"
#include "state_dict/finite_values.h"
#include "state_dict/json_files.h"
#include "state_dict/hugging_face_files.h"
#include "state_dict/safetensors_metadata.h"
#include "state_dict/peft_files.h"
#include "state_dict/load_shards.h"

namespace fsdp::peft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPrefix = "base_model.model.";
const char* const kConfigFile = "adapter_config.json";
const char* const kWeightsFile = "adapter_model.safetensors";
const std::string kDownSuffix = ".lora_A.weight", kUpSuffix = ".lora_B.weight";

// The adapted linear's weight name of an adapter parameter ("x.q_proj.lora_A.weight" -> "x.q_proj.weight").
std::string base_weight_of(const std::string& adapter_param) {
  return adapter_param.substr(0, adapter_param.size() - kDownSuffix.size()) + ".weight";
}

// A key of adapter_config.json that must be absent, null, false or empty
// (PEFT's defaults) for the adapters here: anything else is refused by its name.
void refuse_set(const json& c, const std::string& path, const char* key, const char* what) {
  if (!c.contains(key)) return;
  const json& v = c.at(key);
  const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
                     (v.is_array() && v.empty());
  TORCH_CHECK(unset, "'", path, "': \"", key, "\" is ", v.dump(), ", but ", what,
              " is not supported here (expected it null, false or empty: plain LoRA)");
}

}  // namespace

AdapterConfig adapter_config(const models::ModelConfig& model, const lora::LoraOptions& options,
                             const std::string& base_model) {
  AdapterConfig config;
  config.lora = options;
  config.fan_in_fan_out = model.kind() == models::ModelKind::kGpt;  // GPT-2's Conv1D keeps [in, out]
  config.base_model = base_model;
  return config;
}

std::string adapter_config_json(const AdapterConfig& config) {
  const lora::LoraOptions& l = config.lora;
  // "all-linear" is a string to PEFT; a list of names otherwise.
  const bool all_linear = l.targets().size() == 1 && l.targets()[0] == "all-linear";
  json c{{"alora_invocation_tokens", nullptr},
         {"alpha_pattern", json::object()},
         {"arrow_config", nullptr},
         {"auto_mapping", nullptr},
         {"base_model_name_or_path", config.base_model.empty() ? json(nullptr) : json(config.base_model)},
         {"bias", "none"},
         {"corda_config", nullptr},
         {"ensure_weight_tying", false},
         {"eva_config", nullptr},
         {"exclude_modules", nullptr},
         {"fan_in_fan_out", config.fan_in_fan_out},
         {"inference_mode", true},
         {"init_lora_weights", true},
         {"kasa_config", nullptr},
         {"layer_replication", nullptr},
         {"layers_pattern", nullptr},
         {"layers_to_transform", nullptr},
         {"loftq_config", json::object()},
         {"lora_alpha", l.alpha()},
         {"lora_bias", false},
         {"lora_dropout", l.dropout()},
         {"lora_ga_config", nullptr},
         {"megatron_config", nullptr},
         {"megatron_core", "megatron.core"},
         {"modules_to_save", nullptr},
         {"monteclora_config", nullptr},
         {"peft_type", "LORA"},
         {"peft_version", "0.21.2"},
         {"qalora_group_size", 16},
         {"r", l.rank()},
         {"rank_pattern", json::object()},
         {"revision", nullptr},
         {"target_modules", all_linear ? json("all-linear") : json(l.targets())},
         {"target_parameters", nullptr},
         {"task_type", "CAUSAL_LM"},
         {"trainable_token_indices", nullptr},
         {"use_bdlora", nullptr},
         {"use_dora", false},
         {"use_qalora", false},
         {"use_rslora", false},
         {"velora_config", nullptr}};
  // PEFT writes an integral alpha as an integer (lora_alpha: int = 8).
  if (l.alpha() == static_cast<double>(static_cast<int64_t>(l.alpha()))) c["lora_alpha"] = static_cast<int64_t>(l.alpha());
  return c.dump(2) + "\n";
}

AdapterConfig read_adapter_config(const std::string& folder) {
  const std::string path = (fs::path(folder) / kConfigFile).string();
  TORCH_CHECK(fs::is_regular_file(path), "'", folder, "' is not a PEFT adapter folder: it has no ", kConfigFile);
  const json c = read_json_file(path);
  TORCH_CHECK(c.is_object(), "'", path, "' is not a JSON object");
  const std::string type = c.value("peft_type", std::string());
  TORCH_CHECK(type == "LORA", "'", path, "': peft_type is \"", type, "\", expected \"LORA\"");
  refuse_set(c, path, "use_dora", "DoRA");
  refuse_set(c, path, "use_rslora", "rank-stabilized LoRA");
  refuse_set(c, path, "lora_bias", "a LoRA bias");
  refuse_set(c, path, "modules_to_save", "training whole modules beside the adapters");
  refuse_set(c, path, "rank_pattern", "a rank per module");
  refuse_set(c, path, "alpha_pattern", "an alpha per module");
  refuse_set(c, path, "layers_to_transform", "adapting some layers only");
  refuse_set(c, path, "exclude_modules", "excluding modules");
  refuse_set(c, path, "target_parameters", "adapting parameters rather than modules");
  refuse_set(c, path, "trainable_token_indices", "training token embeddings");
  refuse_set(c, path, "layer_replication", "layer replication");
  refuse_set(c, path, "use_qalora", "QA-LoRA");
  refuse_set(c, path, "alora_invocation_tokens", "activated LoRA");
  for (const char* variant : {"use_bdlora", "arrow_config", "kasa_config", "velora_config", "monteclora_config"}) {
    refuse_set(c, path, variant, "a LoRA variant");
  }
  // PiSSA, OLoRA, CorDA, LoftQ and the like change the base weights when they
  // make the adapters: over the base model as downloaded, the adapters would
  // not compute what they were trained to.
  if (c.contains("init_lora_weights") && c.at("init_lora_weights").is_string()) {
    const std::string init = c.at("init_lora_weights").get<std::string>();
    TORCH_CHECK(init == "gaussian", "'", path, "': \"init_lora_weights\" is \"", init,
                "\", which changes the base model's weights: not supported here (expected true, false or \"gaussian\")");
  }
  const std::string bias = c.value("bias", std::string("none"));
  TORCH_CHECK(bias == "none", "'", path, "': \"bias\" is \"", bias,
              "\", but training biases beside the adapters is not supported here (expected \"none\")");
  auto number = [&](const char* key) {
    TORCH_CHECK(c.contains(key) && c.at(key).is_number(), "'", path, "' has no number \"", key, "\"");
    return c.at(key).get<double>();
  };
  AdapterConfig config;
  const double r = number("r");
  TORCH_CHECK(r >= 1 && r == static_cast<double>(static_cast<int64_t>(r)), "'", path,
              "': \"r\" must be a whole number of at least 1, got ", r);
  config.lora.rank(static_cast<int64_t>(r)).alpha(number("lora_alpha"));
  config.lora.dropout(c.contains("lora_dropout") ? number("lora_dropout") : 0.0);
  TORCH_CHECK(c.contains("target_modules"), "'", path, "' has no \"target_modules\"");
  const json& targets = c.at("target_modules");
  if (targets.is_string()) {
    // PEFT reads any other string as a regular expression over the whole module name.
    TORCH_CHECK(targets.get<std::string>() == "all-linear", "'", path, "': \"target_modules\" is the regular expression ",
                targets.dump(), ", which is not supported here (expected a list of module names, or \"all-linear\")");
    config.lora.targets({"all-linear"});
  } else {
    TORCH_CHECK(targets.is_array() && !targets.empty(), "'", path,
                "': \"target_modules\" must be a list of module names, got ", targets.dump());
    config.lora.targets(targets.get<std::vector<std::string>>());
  }
  config.fan_in_fan_out = c.value("fan_in_fan_out", false);
  const json base = c.value("base_model_name_or_path", json(nullptr));
  if (base.is_string()) config.base_model = base.get<std::string>();
  return config;
}

std::string to_peft_name(const models::ModelConfig& model, const std::string& name) {
  return kPrefix + hugging_face::to_hf_name(model, name);
}

std::vector<safetensors::TensorSpec> adapter_specs(const models::ModelConfig& model,
                                                   const std::vector<lora::AdapterInfo>& adapters) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& spec : hugging_face::detail::adapter(model.kind()).parameter_specs(model)) {
    shapes[spec.name] = spec.shape;
  }
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& a : adapters) {
    const auto it = shapes.find(a.linear + ".weight");
    TORCH_CHECK(it != shapes.end() && it->second.size() == 2, "peft::adapter_specs: '", a.linear,
                "' is not a linear of the ", fsdp::enum_name(model.kind()), " model");
    const int64_t out = it->second[0], in = it->second[1];
    specs.push_back({a.linear + kDownSuffix, torch::kFloat, {a.rank, in}});
    specs.push_back({a.linear + kUpSuffix, torch::kFloat, {out, a.rank}});
  }
  return specs;
}

void load_adapter(FsdpState& state, const std::string& folder, const models::ModelConfig& model,
                  const std::vector<lora::AdapterInfo>& adapters) {
  const std::string path = (fs::path(folder) / kWeightsFile).string();
  TORCH_CHECK(fs::is_regular_file(path), "'", folder, "' has no ", kWeightsFile,
              " (a PEFT adapter folder holds it beside adapter_config.json)");
  const safetensors::Reader reader(path);
  std::map<std::string, std::vector<int64_t>> expected;
  for (const auto& spec : adapter_specs(model, adapters)) expected[spec.name] = spec.shape;
  std::map<std::string, const safetensors::TensorEntry*> by_name;  // the model's names
  for (const auto& entry : reader.tensors()) {
    const std::string& key = entry.spec.name;
    const auto ours = key.rfind(kPrefix, 0) == 0 ? hugging_face::from_hf_name(model, key.substr(kPrefix.size()))
                                                 : std::nullopt;
    TORCH_CHECK(ours && expected.count(*ours), "'", path, "' has a tensor '", key,
                "' that is not one of the model's adapters (expected names such as '",
                expected.empty() ? std::string("?") : to_peft_name(model, expected.begin()->first), "')");
    TORCH_CHECK(entry.spec.shape == expected.at(*ours), "'", path, "': tensor '", key, "' has shape ",
                c10::IntArrayRef(entry.spec.shape), ", expected ", c10::IntArrayRef(expected.at(*ours)),
                " (the adapter's rank and its linear's shape)");
    const torch::ScalarType dtype = entry.spec.dtype;
    TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf, "'", path,
                "': tensor '", key, "' is ", safetensors::dtype_code(dtype), ", expected F32, BF16 or F16");
    by_name[*ours] = &entry;
  }
  for (const auto& [name, shape] : expected) {
    TORCH_CHECK(by_name.count(name), "'", path, "' has no tensor '", to_peft_name(model, name), "' (expected shape ",
                c10::IntArrayRef(shape), ")");
  }
  load_shards(
      state,
      [&](const std::string& name, int64_t offset, torch::Tensor& out) {
        const safetensors::TensorEntry& entry = *by_name.at(name);
        if (entry.spec.dtype == torch::kFloat) return reader.read_into(entry.spec.name, offset, out);
        torch::Tensor piece = torch::empty({out.numel()}, entry.spec.dtype);
        reader.read_into(entry.spec.name, offset, piece);
        out.copy_(piece);
      },
      lora::is_adapter_parameter);
}

AdapterWriter::AdapterWriter(const std::string& folder, const models::ModelConfig& model, const AdapterConfig& config,
                             const std::vector<safetensors::TensorSpec>& tensors, torch::ScalarType dtype)
    : folder_(folder), config_(config), dtype_(dtype) {
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "peft::AdapterWriter: adapters are written as float32, bfloat16 or float16, not ", dtype);
  made_folder_ = !fs::exists(folder);
  fs::create_directories(folder);
  fs::remove(fs::path(folder) / kConfigFile);  // until commit() the folder is not an adapter
  std::vector<safetensors::TensorSpec> kept;
  for (const auto& t : tensors) {
    names_.push_back(t.name);
    kept_.push_back(lora::is_adapter_parameter(t.name));
    if (kept_.back()) kept.push_back({to_peft_name(model, t.name), dtype, t.shape});
  }
  TORCH_CHECK(!kept.empty(), "peft::AdapterWriter: the model has no LoRA adapters to write");
  writer_.emplace((fs::path(folder) / kWeightsFile).string(), kept, std::map<std::string, std::string>{{"format", "pt"}});
}

AdapterWriter::~AdapterWriter() {
  if (committed_ || !made_folder_) return;
  writer_.reset();  // its temporary file first
  std::error_code ignored;
  fs::remove_all(folder_, ignored);
}

void AdapterWriter::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < kept_.size(), "peft::AdapterWriter: more tensors written than the ", kept_.size(), " listed");
  const size_t index = next_++;
  if (kept_[index]) writer_->write(hugging_face::detail::finite_in_dtype(tensor, dtype_, names_[index], folder_).contiguous());
}

void AdapterWriter::commit() {
  TORCH_CHECK(next_ == kept_.size(), "peft::AdapterWriter: ", next_, " of ", kept_.size(), " tensors written");
  writer_->commit();
  write_text_file(fs::path(folder_) / kConfigFile, adapter_config_json(config_));
  committed_ = true;
}

std::vector<safetensors::TensorSpec> without_adapters(const std::vector<safetensors::TensorSpec>& tensors) {
  std::vector<safetensors::TensorSpec> kept;
  for (const auto& t : tensors) {
    if (!lora::is_adapter_parameter(t.name)) kept.push_back(t);
  }
  return kept;
}

MergingWriter::MergingWriter(const std::vector<safetensors::TensorSpec>& tensors,
                             const std::vector<lora::AdapterInfo>& adapters, std::unique_ptr<WeightWriter> inner)
    : inner_(std::move(inner)) {
  for (const auto& t : tensors) names_.push_back(t.name);
  for (const auto& a : adapters) scaling_[a.linear + ".weight"] = a.scaling();
}

void MergingWriter::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < names_.size(), "peft::MergingWriter: more tensors written than the ", names_.size(), " listed");
  const std::string& name = names_[next_++];
  if (ends_with(name, kDownSuffix)) {
    down_[base_weight_of(name)] = tensor.to(torch::kFloat).clone();
  } else if (ends_with(name, kUpSuffix)) {
    up_[base_weight_of(name)] = tensor.to(torch::kFloat).clone();
  } else {
    // The writer's tensor may be a view into a buffer reused for the next one: a copy if it waits.
    pending_.push_back({scaling_.count(name) ? name : "", tensor});
    if (!pending_.back().weight.empty() || pending_.size() > 1) pending_.back().value = tensor.to(torch::kFloat).clone();
  }
  flush();
}

void MergingWriter::flush() {
  while (!pending_.empty()) {
    Pending& front = pending_.front();
    if (!front.weight.empty()) {
      const auto down = down_.find(front.weight), up = up_.find(front.weight);
      if (down == down_.end() || up == up_.end()) return;  // its adapters are still to come
      // PEFT's merge (LoraLayer.merge, get_delta_weight): W + (B @ A) * scaling, in our [out, in] layout.
      front.value = front.value + torch::matmul(up->second, down->second) * scaling_.at(front.weight);
      down_.erase(down);
      up_.erase(up);
    }
    inner_->write(front.value);
    pending_.pop_front();
  }
}

void MergingWriter::commit() {
  TORCH_CHECK(next_ == names_.size(), "peft::MergingWriter: ", next_, " of ", names_.size(), " tensors written");
  TORCH_CHECK(pending_.empty() && down_.empty() && up_.empty(), "peft::MergingWriter: ", pending_.size(),
              " weight(s) still wait for their adapters, ", down_.size() + up_.size(),
              " adapter(s) for their weights: an adapter whose linear was not written");
  inner_->commit();
}

}  // namespace fsdp::peft
