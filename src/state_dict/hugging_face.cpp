// Hugging Face model folders in and out (fsdp/hugging_face.h): config.json,
// the name map, GPT-2's Conv1D layout, and the streaming conversions.

#include "fsdp/hugging_face.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "fsdp/checkpoint.h"
#include "fsdp/wrap_policy.h"
#include "state_dict/checkpoint_json.h"
#include "base/file_io.h"

namespace fsdp::hugging_face {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

const char* kTransformerPrefix = "transformer.";

// The folder a path names: itself, or the one holding the file.
fs::path folder_of(const std::string& path) {
  return fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
}

json read_json(const std::string& path) {
  file_io::require_regular_file(path);  // a named pipe would block the open; a directory read as bad JSON
  std::ifstream in(path);
  TORCH_CHECK(in, "cannot open '", path, "' for reading");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not valid JSON: ", e.what());
    throw;
  }
}

// A field of config.json, with its default when absent (transformers' own defaults).
template <typename T>
T field(const json& config, const std::string& path, const char* name, std::optional<T> fallback = std::nullopt) {
  if (!config.contains(name) || config.at(name).is_null()) {
    TORCH_CHECK(fallback, "'", path, "' has no \"", name, "\"");
    return *fallback;
  }
  const json& value = config.at(name);
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
    TORCH_CHECK(false, "'", path, "': \"", name, "\" is ", config.at(name).dump(), ", of the wrong type");
    throw;
  }
}

// Dropout the model does not have: a non-zero rate is read, and said to be
// ignored (GPT-2's own config.json sets 0.1 for each), not refused.
void note_ignored_dropout(const json& c, const std::string& path, std::initializer_list<const char*> names,
                          ModelConfig& config) {
  for (const char* name : names) {
    const double rate = field<double>(c, path, name, 0.0);
    if (rate != 0.0) {
      std::ostringstream note;
      note << "'" << path << "': \"" << name << "\" " << rate << " is ignored: the model trains without dropout";
      config.ignored.push_back(note.str());
    }
  }
}

ModelConfig read_gpt2_config(const json& c, const std::string& path) {
  ModelConfig config;
  config.architecture = Architecture::kGpt2;
  models::GPTConfig& g = config.gpt;
  g.vocab = field<int64_t>(c, path, "vocab_size", int64_t{50257});
  g.context = field<int64_t>(c, path, "n_positions", int64_t{1024});
  g.layers = field<int64_t>(c, path, "n_layer", int64_t{12});
  g.heads = field<int64_t>(c, path, "n_head", int64_t{12});
  g.width = field<int64_t>(c, path, "n_embd", int64_t{768});
  const auto activation = field<std::string>(c, path, "activation_function", std::string("gelu_new"));
  TORCH_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", "'", path,
              "': \"activation_function\" is \"", activation,
              "\"; the model has GELU's tanh form only (gelu_new or gelu_pytorch_tanh)");
  const double eps = field<double>(c, path, "layer_norm_epsilon", 1e-5);
  TORCH_CHECK(std::abs(eps - 1e-5) <= 1e-12, "'", path, "': \"layer_norm_epsilon\" is ", eps,
              "; the model's LayerNorm epsilon is 1e-05");
  const int64_t inner = field<int64_t>(c, path, "n_inner", 4 * g.width);
  TORCH_CHECK(inner == 4 * g.width, "'", path, "': \"n_inner\" is ", inner, "; the model's MLP is 4 x n_embd = ",
              4 * g.width);
  TORCH_CHECK(field<bool>(c, path, "tie_word_embeddings", true), "'", path,
              "': \"tie_word_embeddings\" is false; the model's head is tied to the token embedding");
  TORCH_CHECK(field<bool>(c, path, "scale_attn_weights", true), "'", path,
              "': \"scale_attn_weights\" is false; the model scales attention by 1 / sqrt(head size)");
  TORCH_CHECK(!field<bool>(c, path, "scale_attn_by_inverse_layer_idx", false), "'", path,
              "': \"scale_attn_by_inverse_layer_idx\" is true; the model does not scale attention by layer");
  TORCH_CHECK(!field<bool>(c, path, "add_cross_attention", false), "'", path,
              "': \"add_cross_attention\" is true; the model is a decoder only");
  note_ignored_dropout(c, path, {"attn_pdrop", "embd_pdrop", "resid_pdrop"}, config);
  g.validate();
  return config;
}

json gpt2_config_json(const models::GPTConfig& g) {
  return json{{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"activation_function", "gelu_new"},
              {"attn_pdrop", 0.1},
              {"embd_pdrop", 0.1},
              {"resid_pdrop", 0.1},
              {"bos_token_id", g.vocab - 1},  // GPT-2's <|endoftext|> is its last token
              {"eos_token_id", g.vocab - 1},
              {"initializer_range", 0.02},
              {"layer_norm_epsilon", 1e-5},
              {"n_ctx", g.context},
              {"n_embd", g.width},
              {"n_head", g.heads},
              {"n_inner", nullptr},
              {"n_layer", g.layers},
              {"n_positions", g.context},
              {"reorder_and_upcast_attn", false},
              {"scale_attn_by_inverse_layer_idx", false},
              {"scale_attn_weights", true},
              {"summary_activation", nullptr},
              {"summary_first_dropout", 0.1},
              {"summary_proj_to_labels", true},
              {"summary_type", "cls_index"},
              {"summary_use_proj", true},
              {"tie_word_embeddings", true},
              {"torch_dtype", "float32"},
              {"use_cache", true},
              {"vocab_size", g.vocab}};
}

// The model's parameters and their shapes, in its named_parameters() order
// (the tied head once, under the embedding's name), without building it.
std::vector<safetensors::TensorSpec> gpt2_parameter_specs(const models::GPTConfig& g) {
  const int64_t C = g.width;
  std::vector<safetensors::TensorSpec> specs{{"transformer.wte.weight", torch::kFloat, {g.vocab, C}},
                                             {"transformer.wpe.weight", torch::kFloat, {g.context, C}}};
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {C}},
             {"ln_1.bias", {C}},
             {"attn.c_attn.weight", {3 * C, C}},
             {"attn.c_attn.bias", {3 * C}},
             {"attn.c_proj.weight", {C, C}},
             {"attn.c_proj.bias", {C}},
             {"ln_2.weight", {C}},
             {"ln_2.bias", {C}},
             {"mlp.c_fc.weight", {4 * C, C}},
             {"mlp.c_fc.bias", {4 * C}},
             {"mlp.c_proj.weight", {C, 4 * C}},
             {"mlp.c_proj.bias", {C}}}) {
      specs.push_back({h + name, torch::kFloat, shape});
    }
  }
  specs.push_back({"transformer.ln_f.weight", torch::kFloat, {C}});
  specs.push_back({"transformer.ln_f.bias", torch::kFloat, {C}});
  return specs;
}

// rope_theta: top level (transformers 4), or in rope_parameters (5); any
// scaling (rope_scaling, a rope_type other than default) is refused.
double read_rope_theta(const json& c, const std::string& path) {
  double theta = field<double>(c, path, "rope_theta", 10000.0);
  if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null()) {
    TORCH_CHECK(false, "'", path, "': \"rope_scaling\" is ", c.at("rope_scaling").dump(),
                "; the model has plain rotary embeddings only (null)");
  }
  if (c.contains("rope_parameters") && c.at("rope_parameters").is_object()) {
    const json& rope = c.at("rope_parameters");
    const auto type = field<std::string>(rope, path, "rope_type", std::string("default"));
    TORCH_CHECK(type == "default", "'", path, "': \"rope_parameters\" has \"rope_type\" \"", type,
                "\"; the model has plain rotary embeddings only (default)");
    theta = field<double>(rope, path, "rope_theta", theta);
  }
  return theta;
}

ModelConfig read_llama_config(const json& c, const std::string& path) {
  ModelConfig config;
  config.architecture = Architecture::kLlama;
  models::LlamaConfig& l = config.llama;
  l.vocab = field<int64_t>(c, path, "vocab_size", int64_t{32000});
  l.width = field<int64_t>(c, path, "hidden_size", int64_t{4096});
  l.hidden = field<int64_t>(c, path, "intermediate_size", int64_t{11008});
  l.layers = field<int64_t>(c, path, "num_hidden_layers", int64_t{32});
  l.heads = field<int64_t>(c, path, "num_attention_heads", int64_t{32});
  l.kv_heads = field<int64_t>(c, path, "num_key_value_heads", l.heads);
  l.context = field<int64_t>(c, path, "max_position_embeddings", int64_t{2048});
  l.norm_eps = field<double>(c, path, "rms_norm_eps", 1e-6);
  l.rope_theta = read_rope_theta(c, path);
  const auto activation = field<std::string>(c, path, "hidden_act", std::string("silu"));
  TORCH_CHECK(activation == "silu", "'", path, "': \"hidden_act\" is \"", activation, "\"; the model's MLP is SwiGLU (silu)");
  TORCH_CHECK(!field<bool>(c, path, "tie_word_embeddings", false), "'", path,
              "': \"tie_word_embeddings\" is true; the model's head is untied");
  TORCH_CHECK(!field<bool>(c, path, "attention_bias", false) && !field<bool>(c, path, "mlp_bias", false), "'", path,
              "': \"attention_bias\" or \"mlp_bias\" is true; the model has no biases");
  const int64_t head_dim = field<int64_t>(c, path, "head_dim", l.width / std::max<int64_t>(l.heads, 1));
  TORCH_CHECK(head_dim * l.heads == l.width, "'", path, "': \"head_dim\" is ", head_dim,
              "; the model's is hidden_size / num_attention_heads = ", l.width / std::max<int64_t>(l.heads, 1));
  note_ignored_dropout(c, path, {"attention_dropout"}, config);
  l.validate();
  return config;
}

json llama_config_json(const models::LlamaConfig& l) {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr},
              {"head_dim", l.head_dim()},
              {"hidden_act", "silu"},
              {"hidden_size", l.width},
              {"initializer_range", 0.02},
              {"intermediate_size", l.hidden},
              {"max_position_embeddings", l.context},
              {"mlp_bias", false},
              {"num_attention_heads", l.heads},
              {"num_hidden_layers", l.layers},
              {"num_key_value_heads", l.kv_heads},
              {"pretraining_tp", 1},
              {"rms_norm_eps", l.norm_eps},
              {"rope_scaling", nullptr},  // transformers 4 reads these two
              {"rope_theta", l.rope_theta},
              {"rope_parameters", {{"rope_theta", l.rope_theta}, {"rope_type", "default"}}},  // transformers 5
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"},
              {"use_cache", true},
              {"vocab_size", l.vocab}};
}

std::vector<safetensors::TensorSpec> llama_parameter_specs(const models::LlamaConfig& l) {
  const int64_t C = l.width, kv = l.kv_heads * l.head_dim();
  std::vector<safetensors::TensorSpec> specs{{"model.embed_tokens.weight", torch::kFloat, {l.vocab, C}}};
  for (int64_t i = 0; i < l.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"input_layernorm.weight", {C}},
             {"self_attn.q_proj.weight", {C, C}},
             {"self_attn.k_proj.weight", {kv, C}},
             {"self_attn.v_proj.weight", {kv, C}},
             {"self_attn.o_proj.weight", {C, C}},
             {"post_attention_layernorm.weight", {C}},
             {"mlp.gate_proj.weight", {l.hidden, C}},
             {"mlp.up_proj.weight", {l.hidden, C}},
             {"mlp.down_proj.weight", {C, l.hidden}}}) {
      specs.push_back({p + name, torch::kFloat, shape});
    }
  }
  specs.push_back({"model.norm.weight", torch::kFloat, {C}});
  specs.push_back({"lm_head.weight", torch::kFloat, {l.vocab, C}});
  return specs;
}

std::vector<safetensors::TensorSpec> parameter_specs(const ModelConfig& config) {
  return config.architecture == Architecture::kGpt2 ? gpt2_parameter_specs(config.gpt)
                                                    : llama_parameter_specs(config.llama);
}

// GPT-2's head is tied: its files hold no lm_head.weight.
bool is_tied_head(Architecture architecture, const std::string& name) {
  return architecture == Architecture::kGpt2 && name == "lm_head.weight";
}

std::vector<int64_t> hf_shape(Architecture architecture, const safetensors::TensorSpec& spec) {
  if (!is_transposed(architecture, spec.name)) return spec.shape;
  return {spec.shape.at(1), spec.shape.at(0)};
}

// The model's name of each tensor of a Hugging Face file that the model keeps.
std::map<std::string, const safetensors::TensorEntry*> entries_by_model_name(const safetensors::Reader& reader,
                                                                            Architecture architecture) {
  std::map<std::string, const safetensors::TensorEntry*> by_name;
  for (const auto& entry : reader.tensors()) {
    const auto name = from_hf_name(architecture, entry.spec.name);
    if (!name) continue;
    TORCH_CHECK(!by_name.count(*name), "'", reader.path(), "' holds '", *name, "' twice (with and without the '",
                kTransformerPrefix, "' prefix)");
    by_name[*name] = &entry;
  }
  return by_name;
}

// Reads one tensor of a Hugging Face file in the model's layout, as `dtype`.
torch::Tensor read_in_model_layout(const safetensors::Reader& reader, const safetensors::TensorEntry& entry,
                                   Architecture architecture, const std::string& name, torch::ScalarType dtype) {
  torch::Tensor value = reader.read(entry.spec.name);
  if (is_transposed(architecture, name)) value = value.t();
  return value.to(dtype).contiguous();
}

void write_text_file(const fs::path& path, const std::string& text) {
  const fs::path temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    TORCH_CHECK(out, "cannot open '", temp.string(), "' for writing");
    out << text;
    out.flush();
    TORCH_CHECK(out, "writing '", temp.string(), "' failed");
  }
  fs::rename(temp, path);
}

}  // namespace

bool is_model(const std::string& path) {
  if (path.empty() || !fs::exists(path)) return false;
  return fs::exists(folder_of(path) / "config.json") &&
         (fs::is_directory(path) || ends_with(path, ".safetensors"));
}

ModelFiles find_model(const std::string& path) {
  TORCH_CHECK(fs::exists(path), "'", path, "' does not exist");
  const fs::path folder = folder_of(path);
  ModelFiles files{fs::is_directory(path) ? (folder / "model.safetensors").string() : path,
                   (folder / "config.json").string()};
  TORCH_CHECK(fs::exists(files.config), "'", path, "' is not a Hugging Face model: '", files.config,
              "' is missing (it gives the model's shape)");
  if (!fs::exists(files.weights) && fs::exists(folder / "model.safetensors.index.json")) {
    TORCH_CHECK(false, "'", path, "' is a sharded Hugging Face checkpoint (model.safetensors.index.json); "
                "merge it into one model.safetensors first (transformers: save_pretrained(folder, "
                "max_shard_size=\"1000GB\"))");
  }
  TORCH_CHECK(fs::exists(files.weights), "'", path, "' is not a Hugging Face model: '", files.weights,
              "' is missing (only safetensors weights are read, not pytorch_model.bin)");
  return files;
}

ModelConfig read_config(const std::string& config_path) {
  const json c = read_json(config_path);
  TORCH_CHECK(c.is_object(), "'", config_path, "' is not a JSON object");
  const auto model_type = field<std::string>(c, config_path, "model_type", std::string());
  TORCH_CHECK(model_type == "gpt2" || model_type == "llama", "'", config_path, "': \"model_type\" is \"",
              model_type, "\"; expected gpt2 or llama");
  ModelConfig config = model_type == "llama" ? read_llama_config(c, config_path) : read_gpt2_config(c, config_path);
  config.source_json = c.dump();
  return config;
}

std::string config_json(const ModelConfig& config) {
  const json ours =
      config.architecture == Architecture::kGpt2 ? gpt2_config_json(config.gpt) : llama_config_json(config.llama);
  json merged = config.source_json.empty() ? json::object() : json::parse(config.source_json);
  for (const auto& [key, value] : ours.items()) {
    const bool token_id = key == "bos_token_id" || key == "eos_token_id";
    if (token_id && merged.contains(key)) continue;  // the source's own special tokens
    if (key == "max_position_embeddings" && merged.contains(key) && merged.at(key).is_number_integer() &&
        merged.at(key).get<int64_t>() > value.get<int64_t>()) {
      continue;  // trained on shorter sequences: rotary positions reach as far as before
    }
    merged[key] = value;
  }
  merged["dtype"] = "float32";  // transformers 5's name of torch_dtype: the weights written are F32
  return merged.dump(2) + "\n";
}

std::string ModelConfig::model_type() const { return architecture == Architecture::kGpt2 ? "gpt" : "llama"; }

std::string ModelConfig::describe() const {
  return architecture == Architecture::kGpt2 ? gpt.describe() : llama.describe();
}

std::shared_ptr<models::LanguageModel> ModelConfig::new_model() const {
  if (architecture == Architecture::kGpt2) return models::GPT(gpt).ptr();
  return models::Llama(llama).ptr();
}

std::string to_hf_name(Architecture, const std::string& name) { return name; }

std::optional<std::string> from_hf_name(Architecture architecture, const std::string& hf_name) {
  if (architecture == Architecture::kLlama) {  // the same names; old files kept RoPE's inverse frequencies
    return ends_with(hf_name, ".rotary_emb.inv_freq") ? std::nullopt : std::optional<std::string>(hf_name);
  }
  if (hf_name == "lm_head.weight") return std::nullopt;  // tied: the token embedding's
  if (ends_with(hf_name, ".attn.bias") || ends_with(hf_name, ".attn.masked_bias")) return std::nullopt;  // buffers
  return starts_with(hf_name, kTransformerPrefix) ? hf_name : kTransformerPrefix + hf_name;
}

bool is_transposed(Architecture architecture, const std::string& name) {
  return architecture == Architecture::kGpt2 && (ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight"));
}

void load_weights(torch::nn::Module& module, const ModelFiles& files, Architecture architecture) {
  safetensors::Reader reader(files.weights);
  const auto by_name = entries_by_model_name(reader, architecture);
  auto params = unique_named_parameters(module);
  std::set<std::string> expected;
  // Everything is checked before anything changes.
  for (const auto& [name, param] : params) {
    expected.insert(name);
    if (is_tied_head(architecture, name)) continue;  // never a parameter of its own in the model
    const auto it = by_name.find(name);
    TORCH_CHECK(it != by_name.end(), "'", files.weights, "' has no tensor '", to_hf_name(architecture, name),
                "' (expected shape ", c10::IntArrayRef(hf_shape(architecture, {name, torch::kFloat, param.sizes().vec()})), ")");
    const auto& spec = it->second->spec;
    const auto want = hf_shape(architecture, {name, torch::kFloat, param.sizes().vec()});
    TORCH_CHECK(spec.shape == want, "'", files.weights, "': tensor '", spec.name, "' has shape ",
                c10::IntArrayRef(spec.shape), ", expected ", c10::IntArrayRef(want), " (from '", files.config, "')");
    TORCH_CHECK(spec.dtype == torch::kFloat || spec.dtype == torch::kBFloat16 || spec.dtype == torch::kHalf, "'",
                files.weights, "': tensor '", spec.name, "' is ", safetensors::dtype_code(spec.dtype),
                ", expected F32, BF16 or F16");
  }
  for (const auto& [name, entry] : by_name) {
    TORCH_CHECK(expected.count(name), "'", files.weights, "' has a tensor '", entry->spec.name,
                "' that the model does not have");
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {  // one tensor read at a time
    if (!by_name.count(name)) continue;
    param.copy_(read_in_model_layout(reader, *by_name.at(name), architecture, name, param.scalar_type()));
  }
}

FolderWriter::FolderWriter(const std::string& folder, const ModelConfig& config,
                           const std::vector<safetensors::TensorSpec>& tensors)
    : folder_(folder), config_(config) {
  fs::create_directories(folder);
  std::vector<safetensors::TensorSpec> hf;
  for (const auto& t : tensors) {
    names_.push_back(t.name);
    if (is_tied_head(config.architecture, t.name)) continue;  // GPT-2's files leave it out
    hf.push_back({to_hf_name(config.architecture, t.name), torch::kFloat, hf_shape(config.architecture, t)});
  }
  writer_.emplace((fs::path(folder) / "model.safetensors").string(), std::move(hf),
                  std::map<std::string, std::string>{{"format", "pt"}});
}

void FolderWriter::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < names_.size(), "FolderWriter: more tensors written than the ", names_.size(), " listed");
  const std::string& name = names_[next_++];
  if (is_tied_head(config_.architecture, name)) return;
  torch::Tensor value = tensor.to(torch::kFloat);
  if (is_transposed(config_.architecture, name)) value = value.t();
  writer_->write(value.contiguous());
}

void FolderWriter::commit() {
  TORCH_CHECK(next_ == names_.size(), "FolderWriter: ", next_, " of ", names_.size(), " tensors written");
  writer_->commit();
  write_text_file(fs::path(folder_) / "config.json", config_json(config_));
}

void convert_file_to_hf(const std::string& spec_file, const ModelConfig& config, const std::string& folder) {
  safetensors::Reader reader(spec_file);
  if (reader.has_checksum()) reader.verify_checksum();
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& t : reader.tensors()) specs.push_back(t.spec);
  FolderWriter writer(folder, config, specs);
  for (const auto& t : reader.tensors()) writer.write(reader.read(t.spec.name));  // one tensor at a time
  writer.commit();
}

void convert_checkpoint_to_hf(const std::string& checkpoint, const ModelConfig& config, const std::string& folder) {
  SavedCheckpoint saved(checkpoint);
  FolderWriter writer(folder, config, saved.weight_specs());
  saved.stream_weights([&](const torch::Tensor& weight) { writer.write(weight); });  // one unit in memory at a time
  writer.commit();
}

void convert_hf_to_file(const std::string& hf_path, const std::string& spec_file) {
  const ModelFiles files = find_model(hf_path);
  const ModelConfig config = read_config(files.config);
  safetensors::Reader reader(files.weights);
  const auto by_name = entries_by_model_name(reader, config.architecture);
  const auto specs = parameter_specs(config);
  for (const auto& s : specs) {
    const auto it = by_name.find(s.name);
    TORCH_CHECK(it != by_name.end(), "'", files.weights, "' has no tensor '", s.name, "'");
    TORCH_CHECK(it->second->spec.shape == hf_shape(config.architecture, s), "'", files.weights, "': tensor '",
                it->second->spec.name, "' has shape ", c10::IntArrayRef(it->second->spec.shape), ", expected ",
                c10::IntArrayRef(hf_shape(config.architecture, s)));
  }
  TORCH_CHECK(by_name.size() == specs.size(), "'", files.weights, "' holds ", by_name.size(),
              " of the model's tensors, expected ", specs.size());
  safetensors::Writer writer(spec_file, specs,
                             {{"format", "pt"}, {"model", config.model_type()}, {"config", config.describe()},
                              {"converted_from", hf_path}});
  for (const auto& s : specs) {  // one tensor at a time
    writer.write(read_in_model_layout(reader, *by_name.at(s.name), config.architecture, s.name, torch::kFloat));
  }
  writer.commit();
}

ModelConfig parse_description(const std::string& model_type, const std::string& text) {
  TORCH_CHECK(model_type == "gpt" || model_type == "llama", "unknown model type '", model_type,
              "': expected gpt or llama");
  std::string body = text;
  if (body.size() >= 2 && body.front() == '"' && body.back() == '"') body = body.substr(1, body.size() - 2);
  ModelConfig config;
  config.architecture = model_type == "gpt" ? Architecture::kGpt2 : Architecture::kLlama;
  std::map<std::string, double> values;
  std::istringstream in(body);
  for (std::string item; std::getline(in, item, ',');) {
    std::istringstream words(item);
    std::string key;
    double value = 0;
    TORCH_CHECK(words >> key >> value, "cannot read the model configuration '", text,
                "': expected 'vocab N, context N, layers N, ...'");
    values[key] = value;
  }
  auto get = [&](const char* key) {
    TORCH_CHECK(values.count(key), "the model configuration '", text, "' has no ", key);
    return values.at(key);
  };
  auto whole = [&](const char* key) { return static_cast<int64_t>(get(key)); };
  if (config.architecture == Architecture::kGpt2) {
    models::GPTConfig& g = config.gpt;
    g.vocab = whole("vocab"), g.context = whole("context"), g.layers = whole("layers"), g.heads = whole("heads");
    g.width = whole("width");
    g.validate();
  } else {
    models::LlamaConfig& l = config.llama;
    l.vocab = whole("vocab"), l.context = whole("context"), l.layers = whole("layers"), l.heads = whole("heads");
    l.kv_heads = whole("kv_heads"), l.width = whole("width"), l.hidden = whole("hidden");
    l.rope_theta = get("rope_theta"), l.norm_eps = get("norm_eps");
    l.validate();
  }
  return config;
}

}  // namespace fsdp::hugging_face
