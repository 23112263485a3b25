// Hugging Face model folders in and out (fsdp/hugging_face.h): config.json,
// each family's adapter (src/models/*_hugging_face.cpp) asked for its names
// and layouts, and the streaming conversions.

#include "fsdp/hugging_face.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "fsdp/checkpoint.h"
#include "fsdp/wrap_policy.h"
#include "state_dict/checkpoint_json.h"
#include "base/file_io.h"
#include "models/hugging_face_adapter.h"

namespace fsdp::hugging_face {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

std::vector<int64_t> hf_shape(const detail::Adapter& adapter, const safetensors::TensorSpec& spec) {
  if (!adapter.is_transposed(spec.name)) return spec.shape;
  return {spec.shape.at(1), spec.shape.at(0)};
}

// The tensors of a model's files that the model keeps, by the model's name,
// each with the file that holds it (the files open, their headers read).
struct HubTensors {
  std::vector<std::unique_ptr<safetensors::Reader>> readers;
  struct Entry {
    const safetensors::Reader* reader;
    const safetensors::TensorEntry* entry;
  };
  std::map<std::string, Entry> by_name;
  std::string where;  // the files, for messages: the one file, or the index
};

HubTensors hub_tensors(const ModelFiles& files, const detail::Adapter& adapter, const models::ModelConfig& config) {
  HubTensors t;
  t.where = files.index.empty() ? files.weights.front() : files.index;
  for (const std::string& path : files.weights) {
    t.readers.push_back(std::make_unique<safetensors::Reader>(path));
    const safetensors::Reader& reader = *t.readers.back();
    for (const auto& entry : reader.tensors()) {
      const auto name = adapter.from_hf_name(config, entry.spec.name);
      if (!name) continue;
      const auto [it, inserted] = t.by_name.try_emplace(*name, HubTensors::Entry{&reader, &entry});
      TORCH_CHECK(inserted, "'", t.where, "' holds '", *name, "' twice (in '", it->second.reader->path(), "' as '",
                  it->second.entry->spec.name, "' and in '", reader.path(), "' as '", entry.spec.name, "')");
    }
  }
  return t;
}

// Reads one tensor of a Hugging Face file in the model's layout, as `dtype`.
torch::Tensor read_in_model_layout(const HubTensors::Entry& tensor, const detail::Adapter& adapter,
                                   const std::string& name, torch::ScalarType dtype) {
  torch::Tensor value = tensor.reader->read(tensor.entry->spec.name);
  if (adapter.is_transposed(name)) value = value.t();
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

int64_t ModelFiles::weight_bytes() const {
  int64_t bytes = 0;
  for (const std::string& file : weights) bytes += static_cast<int64_t>(fs::file_size(file));
  return bytes;
}

std::string find_config(const std::string& path) {
  TORCH_CHECK(fs::exists(path), "'", path, "' does not exist");
  if (!fs::is_directory(path) && ends_with(path, ".json")) return path;
  const std::string config = (folder_of(path) / "config.json").string();
  TORCH_CHECK(fs::exists(config), "'", path, "' is not a Hugging Face model: '", config,
              "' is missing (it gives the model's shape)");
  return config;
}

ModelFiles find_model(const std::string& path) {
  TORCH_CHECK(fs::is_directory(path) || !ends_with(path, ".json"), "'", path,
              "' is a model's config.json, not its weights: give its folder");
  const fs::path folder = folder_of(path);
  ModelFiles files;
  files.config = find_config(path);
  const fs::path single = fs::is_directory(path) ? folder / "model.safetensors" : fs::path(path);
  const fs::path index = folder / "model.safetensors.index.json";
  if (fs::exists(single) || !fs::is_directory(path) || !fs::exists(index)) {
    TORCH_CHECK(fs::exists(single), "'", path, "' is not a Hugging Face model: '", single.string(),
                "' is missing (only safetensors weights are read, not pytorch_model.bin)");
    files.weights = {single.string()};
    return files;
  }
  // A sharded folder: the index's weight_map names each tensor's file; every
  // file it names is read (a tensor in another file than the map says is
  // still found, by its name).
  files.index = index.string();
  const json map = read_json(files.index);
  TORCH_CHECK(map.is_object() && map.contains("weight_map") && map.at("weight_map").is_object() &&
                  !map.at("weight_map").empty(),
              "'", files.index, "' has no \"weight_map\" of tensor names to files");
  std::set<std::string> seen;
  for (const auto& [tensor, file] : map.at("weight_map").items()) {
    TORCH_CHECK(file.is_string(), "'", files.index, "': the file of '", tensor, "' is ", file.dump(), ", expected a name");
    const std::string name = file.get<std::string>();
    TORCH_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..", "'", files.index,
                "': the file of '", tensor, "' is '", name, "', expected a file name in the folder");
    if (!seen.insert(name).second) continue;
    const fs::path shard = folder / name;
    TORCH_CHECK(fs::exists(shard), "'", files.index, "' names '", name, "' (for '", tensor, "'), which is missing");
    files.weights.push_back(shard.string());
  }
  return files;
}

HubConfig read_config(const std::string& config_path) {
  const json c = read_json(config_path);
  TORCH_CHECK(c.is_object(), "'", config_path, "' is not a JSON object");
  const auto model_type = detail::field<std::string>(c, config_path, "model_type", std::string());
  const detail::Adapter* adapter = detail::adapter_for_model_type(model_type);
  TORCH_CHECK(adapter, "'", config_path, "': \"model_type\" is \"", model_type, "\"; expected ",
              detail::known_model_types());
  HubConfig config;
  config.model = adapter->read_config(c, config_path, config.ignored);
  config.source_json = c.dump();
  return config;
}

std::string config_json(const HubConfig& config) {
  const json ours = detail::adapter(config.model.kind()).config_json(config.model);
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

std::string to_hf_name(const models::ModelConfig& config, const std::string& name) {
  return detail::adapter(config.kind()).to_hf_name(name);
}

std::optional<std::string> from_hf_name(const models::ModelConfig& config, const std::string& hf_name) {
  return detail::adapter(config.kind()).from_hf_name(config, hf_name);
}

bool is_transposed(const models::ModelConfig& config, const std::string& name) {
  return detail::adapter(config.kind()).is_transposed(name);
}

void load_weights(torch::nn::Module& module, const ModelFiles& files, const models::ModelConfig& config) {
  const detail::Adapter& adapter = detail::adapter(config.kind());
  const HubTensors hub = hub_tensors(files, adapter, config);
  const auto& by_name = hub.by_name;
  auto params = unique_named_parameters(module);
  std::set<std::string> expected;
  // Everything is checked before anything changes.
  for (const auto& [name, param] : params) {
    expected.insert(name);
    if (adapter.is_tied_head(config, name)) continue;  // never a parameter of its own in the model
    const auto want = hf_shape(adapter, {name, torch::kFloat, param.sizes().vec()});
    const auto it = by_name.find(name);
    TORCH_CHECK(it != by_name.end(), "'", hub.where, "' has no tensor '", adapter.to_hf_name(name),
                "' (expected shape ", c10::IntArrayRef(want), ")");
    const auto& spec = it->second.entry->spec;
    const std::string& file = it->second.reader->path();
    TORCH_CHECK(spec.shape == want, "'", file, "': tensor '", spec.name, "' has shape ",
                c10::IntArrayRef(spec.shape), ", expected ", c10::IntArrayRef(want), " (from '", files.config, "')");
    TORCH_CHECK(spec.dtype == torch::kFloat || spec.dtype == torch::kBFloat16 || spec.dtype == torch::kHalf, "'",
                file, "': tensor '", spec.name, "' is ", safetensors::dtype_code(spec.dtype),
                ", expected F32, BF16 or F16");
  }
  for (const auto& [name, tensor] : by_name) {
    TORCH_CHECK(expected.count(name), "'", tensor.reader->path(), "' has a tensor '", tensor.entry->spec.name,
                "' that the model does not have");
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {  // one tensor read at a time
    if (!by_name.count(name)) continue;
    param.copy_(read_in_model_layout(by_name.at(name), adapter, name, param.scalar_type()));
  }
}

FolderWriter::FolderWriter(const std::string& folder, const HubConfig& config,
                           const std::vector<safetensors::TensorSpec>& tensors)
    : folder_(folder), config_(config) {
  const detail::Adapter& adapter = detail::adapter(config.model.kind());
  fs::create_directories(folder);
  std::vector<safetensors::TensorSpec> hf;
  for (const auto& t : tensors) {
    names_.push_back(t.name);
    if (adapter.is_tied_head(config.model, t.name)) continue;  // GPT-2's files leave it out
    hf.push_back({adapter.to_hf_name(t.name), torch::kFloat, hf_shape(adapter, t)});
  }
  writer_.emplace((fs::path(folder) / "model.safetensors").string(), std::move(hf),
                  std::map<std::string, std::string>{{"format", "pt"}});
}

void FolderWriter::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < names_.size(), "FolderWriter: more tensors written than the ", names_.size(), " listed");
  const std::string& name = names_[next_++];
  const detail::Adapter& adapter = detail::adapter(config_.model.kind());
  if (adapter.is_tied_head(config_.model, name)) return;
  torch::Tensor value = tensor.to(torch::kFloat);
  if (adapter.is_transposed(name)) value = value.t();
  writer_->write(value.contiguous());
}

void FolderWriter::commit() {
  TORCH_CHECK(next_ == names_.size(), "FolderWriter: ", next_, " of ", names_.size(), " tensors written");
  writer_->commit();
  write_text_file(fs::path(folder_) / "config.json", config_json(config_));
}

void convert_file_to_hf(const std::string& spec_file, const HubConfig& config, const std::string& folder) {
  safetensors::Reader reader(spec_file);
  if (reader.has_checksum()) reader.verify_checksum();
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& t : reader.tensors()) specs.push_back(t.spec);
  FolderWriter writer(folder, config, specs);
  for (const auto& t : reader.tensors()) writer.write(reader.read(t.spec.name));  // one tensor at a time
  writer.commit();
}

void convert_checkpoint_to_hf(const std::string& checkpoint, const HubConfig& config, const std::string& folder) {
  SavedCheckpoint saved(checkpoint);
  FolderWriter writer(folder, config, saved.weight_specs());
  saved.stream_weights([&](const torch::Tensor& weight) { writer.write(weight); });  // one unit in memory at a time
  writer.commit();
}

void convert_hf_to_file(const std::string& hf_path, const std::string& spec_file) {
  const ModelFiles files = find_model(hf_path);
  const models::ModelConfig config = read_config(files.config).model;
  const detail::Adapter& adapter = detail::adapter(config.kind());
  const HubTensors hub = hub_tensors(files, adapter, config);
  const auto& by_name = hub.by_name;
  const auto specs = adapter.parameter_specs(config);
  for (const auto& s : specs) {
    const auto it = by_name.find(s.name);
    TORCH_CHECK(it != by_name.end(), "'", hub.where, "' has no tensor '", s.name, "'");
    const auto& spec = it->second.entry->spec;
    TORCH_CHECK(spec.shape == hf_shape(adapter, s), "'", it->second.reader->path(), "': tensor '", spec.name,
                "' has shape ", c10::IntArrayRef(spec.shape), ", expected ", c10::IntArrayRef(hf_shape(adapter, s)));
  }
  TORCH_CHECK(by_name.size() == specs.size(), "'", hub.where, "' holds ", by_name.size(),
              " of the model's tensors, expected ", specs.size());
  safetensors::Writer writer(spec_file, specs,
                             {{"format", "pt"}, {"model", models::model_kind_name(config.kind())}, {"config", config.describe()},
                              {"converted_from", hf_path}});
  for (const auto& s : specs) {  // one tensor at a time
    writer.write(read_in_model_layout(by_name.at(s.name), adapter, s.name, torch::kFloat));
  }
  writer.commit();
}

}  // namespace fsdp::hugging_face
