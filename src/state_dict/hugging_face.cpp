// Hugging Face model folders in and out (fsdp/hugging_face.h): config.json,
// each family's adapter (src/models/*_hugging_face.cpp) asked for its names
// and layouts, and the streaming conversions.

#include "fsdp/hugging_face.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>

#include "fsdp/checkpoint.h"
#include "fsdp/lora.h"
#include "fsdp/wrap_policy.h"
#include "state_dict/checkpoint_json.h"
#include "state_dict/finite_values.h"
#include "state_dict/json_files.h"
#include "base/file_io.h"
#include "base/strings.h"
#include "models/hugging_face_adapter.h"
#include "state_dict/hugging_face_files.h"
#include "state_dict/bitsandbytes_files.h"
#include "state_dict/safetensors_metadata.h"
#include "state_dict/load_shards.h"
#include "core/unit_plan.h"

namespace fsdp::hugging_face {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The folder a path names: itself, or the one holding the file.
fs::path folder_of(const std::string& path) {
  return fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
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
    std::optional<detail::Nf4State> nf4;  // stored by bitsandbytes in NF4 (a -bnb-4bit folder)
  };
  std::map<std::string, Entry> by_name;
  std::map<std::string, Entry> by_hf_name;  // every tensor of the files, the side tensors of NF4 weights too
  detail::TensorLookup lookup() const {
    return [this](const std::string& hf_name) {
      const auto it = by_hf_name.find(hf_name);
      return it == by_hf_name.end() ? std::make_pair(nullptr, nullptr)
                                    : std::make_pair(it->second.reader, it->second.entry);
    };
  }
  std::string where;  // the files, for messages: the one file, or the index
};

HubTensors hub_tensors(const ModelFiles& files, const detail::Adapter& adapter, const models::ModelConfig& config) {
  HubTensors t;
  t.where = files.index.empty() ? files.weights.front() : files.index;
  for (const std::string& path : files.weights) {
    t.readers.push_back(std::make_unique<safetensors::Reader>(path));
    const safetensors::Reader& reader = *t.readers.back();
    for (const auto& entry : reader.tensors()) {
      t.by_hf_name.try_emplace(entry.spec.name, HubTensors::Entry{&reader, &entry, std::nullopt});
      if (detail::is_quantization_side_tensor(entry.spec.name)) continue;  // read with its weight (read_nf4)
      const auto name = adapter.from_hf_name(config, entry.spec.name);
      if (!name) continue;
      const auto [it, inserted] = t.by_name.try_emplace(*name, HubTensors::Entry{&reader, &entry, std::nullopt});
      TORCH_CHECK(inserted, "'", t.where, "' holds '", *name, "' twice (in '", it->second.reader->path(), "' as '",
                  it->second.entry->spec.name, "' and in '", reader.path(), "' as '", entry.spec.name, "')");
    }
  }
  for (auto& [name, tensor] : t.by_name) tensor.nf4 = detail::nf4_state(tensor.entry->spec.name, t.lookup());
  return t;
}

// Checks the files against the model's parameters (names and shapes as the
// model has them): each one there with Hugging Face's shape and a float
// dtype, nothing else there.
void check_tensors(const HubTensors& hub, const detail::Adapter& adapter, const ModelFiles& files,
                   const std::vector<safetensors::TensorSpec>& params) {
  std::set<std::string> expected;
  for (const auto& param : params) {
    expected.insert(param.name);
    const auto want = hf_shape(adapter, param);
    const auto it = hub.by_name.find(param.name);
    TORCH_CHECK(it != hub.by_name.end(), "'", hub.where, "' has no tensor '", adapter.to_hf_name(param.name),
                "' (expected shape ", c10::IntArrayRef(want), ")");
    const auto& spec = it->second.entry->spec;
    const std::string& file = it->second.reader->path();
    if (it->second.nf4) {  // bitsandbytes' packed codes: its quant_state gives the shape (read_nf4 checks the rest)
      TORCH_CHECK(it->second.nf4->shape == want, "'", file, "': tensor '", spec.name, "' is NF4 of shape ",
                  c10::IntArrayRef(it->second.nf4->shape), ", expected ", c10::IntArrayRef(want), " (from '",
                  files.config, "')");
      continue;
    }
    TORCH_CHECK(spec.shape == want, "'", file, "': tensor '", spec.name, "' has shape ",
                c10::IntArrayRef(spec.shape), ", expected ", c10::IntArrayRef(want), " (from '", files.config, "')");
    TORCH_CHECK(spec.dtype == torch::kFloat || spec.dtype == torch::kBFloat16 || spec.dtype == torch::kHalf, "'",
                file, "': tensor '", spec.name, "' is ", safetensors::dtype_code(spec.dtype),
                ", expected F32, BF16 or F16");
  }
  for (const auto& [name, tensor] : hub.by_name) {
    TORCH_CHECK(expected.count(name), "'", tensor.reader->path(), "' has a tensor '", tensor.entry->spec.name,
                "' that the model does not have");
  }
}

// Reads one tensor of a Hugging Face file in the model's layout, as `dtype`.
torch::Tensor read_in_model_layout(const HubTensors& hub, const HubTensors::Entry& tensor,
                                   const detail::Adapter& adapter, const std::string& name, torch::ScalarType dtype) {
  torch::Tensor value = tensor.nf4 ? detail::read_nf4(tensor.entry->spec.name, *tensor.nf4, hub.lookup())
                                   : tensor.reader->read(tensor.entry->spec.name);
  if (adapter.is_transposed(name)) value = value.t();
  return value.to(dtype).contiguous();
}

const char* config_dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kHalf: return "float16";
    default: TORCH_CHECK(false, "Hugging Face weights are float32, bfloat16 or float16, not ", dtype);
  }
}

// save_pretrained's weight file names.
std::string shard_file_name(size_t shard, size_t shards) {
  if (shards == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", shard + 1, shards);
  return name;
}

bool is_weight_file_name(const std::string& name) {
  return name == "model.safetensors" ||
         (name.rfind("model-", 0) == 0 && ends_with(name, ".safetensors") && name.find("-of-") != std::string::npos);
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

torch::ScalarType stored_dtype(const ModelFiles& files) {
  std::optional<torch::ScalarType> dtype;
  for (const std::string& path : files.weights) {
    const safetensors::Reader reader(path);
    for (const auto& entry : reader.tensors()) {
      // A -bnb-4bit folder's packed weights and their side tensors: its
      // float tensors are in the dtype it computes in.
      if (entry.spec.dtype == torch::kByte || detail::is_quantization_side_tensor(entry.spec.name)) continue;
      if (!dtype) dtype = entry.spec.dtype;
      if (*dtype != entry.spec.dtype) return torch::kFloat;
    }
  }
  return dtype.value_or(torch::kFloat);
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
  const json map = read_json_file(files.index);
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
  const json c = read_json_file(config_path);
  TORCH_CHECK(c.is_object(), "'", config_path, "' is not a JSON object");
  const auto model_type = detail::field<std::string>(c, config_path, "model_type", std::string());
  const detail::Adapter* adapter = detail::adapter_for_model_type(model_type);
  TORCH_CHECK(adapter, "'", config_path, "': \"model_type\" is \"", model_type, "\"; expected ",
              detail::known_model_types());
  detail::check_quantization_config(c, config_path);
  HubConfig config;
  config.model = adapter->read_config(c, config_path, config.ignored);
  config.source_json = c.dump();
  return config;
}

std::string config_json(const HubConfig& config, torch::ScalarType dtype) {
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
  merged.erase("quantization_config");  // a -bnb-4bit source's: what is written is float
  merged["dtype"] = config_dtype_name(dtype);  // transformers 5's name of torch_dtype: the weights' dtype
  if (merged.contains("torch_dtype")) merged["torch_dtype"] = merged["dtype"];  // what transformers 4 reads
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
  auto params = unique_named_parameters(module);
  // LoRA adapters are not the base model's: they come from a PEFT folder (fsdp/peft.h) or their initialization.
  params.erase(std::remove_if(params.begin(), params.end(),
                              [](const auto& item) { return lora::is_adapter_parameter(item.first); }),
               params.end());
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& [name, param] : params) specs.push_back({name, torch::kFloat, param.sizes().vec()});
  check_tensors(hub, adapter, files, specs);  // everything is checked before anything changes
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {  // one tensor read at a time
    param.copy_(read_in_model_layout(hub, hub.by_name.at(name), adapter, name, param.scalar_type()));
  }
}

void check_weights(const ModelFiles& files, const models::ModelConfig& config) {
  const detail::Adapter& adapter = detail::adapter(config.kind());
  check_tensors(hub_tensors(files, adapter, config), adapter, files, adapter.parameter_specs(config));
}

void load_weights(FsdpState& state, const ModelFiles& files, const models::ModelConfig& config) {
  const detail::Adapter& adapter = detail::adapter(config.kind());
  const HubTensors hub = hub_tensors(files, adapter, config);
  check_tensors(hub, adapter, files, adapter.parameter_specs(config));  // the base model's, without adapters
  const auto base_only = [](const std::string& name) { return !lora::is_adapter_parameter(name); };
  load_shards(state, [&](const std::string& name, int64_t offset, torch::Tensor& out) {
    const HubTensors::Entry& tensor = hub.by_name.at(name);
    // Its rows the file's columns, or NF4 codes to dequantize: the whole tensor.
    if (adapter.is_transposed(name) || tensor.nf4) {
      out.copy_(read_in_model_layout(hub, tensor, adapter, name, torch::kFloat).view({-1}).narrow(0, offset, out.numel()));
      return;
    }
    const torch::ScalarType stored = tensor.entry->spec.dtype;
    if (stored == torch::kFloat) return tensor.reader->read_into(tensor.entry->spec.name, offset, out);
    torch::Tensor piece = torch::empty({out.numel()}, stored);
    tensor.reader->read_into(tensor.entry->spec.name, offset, piece);
    out.copy_(piece);
  }, base_only);
}

int64_t parse_size(const std::string& text) {
  size_t used = 0;
  double number = -1;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  static const std::vector<std::pair<std::string, double>> units{
      {"", 1},       {"B", 1},          {"KB", 1e3},         {"MB", 1e6},        {"GB", 1e9},
      {"TB", 1e12},  {"KiB", 1024.0},   {"MiB", 1048576.0},  {"GiB", 1073741824.0}};
  for (const auto& [name, scale] : units) {
    if (used == 0 || unit != name) continue;
    const double bytes = number * scale;
    TORCH_CHECK(bytes >= 1 && bytes < 9e18, "'", text, "' is not a positive size that fits in 64 bits");
    return static_cast<int64_t>(bytes);
  }
  TORCH_CHECK(false, "'", text, "' is not a size: expected a number of bytes, or one with KB, MB, GB, TB, KiB, MiB or "
              "GiB (\"5GB\", \"500MB\")");
}

FolderWriter::FolderWriter(const std::string& folder, const HubConfig& config,
                           const std::vector<safetensors::TensorSpec>& tensors, SaveOptions options)
    : folder_(folder), config_(config), options_(options) {
  const detail::Adapter& adapter = detail::adapter(config.model.kind());
  config_dtype_name(options.dtype());  // refuses another dtype before anything is written
  TORCH_CHECK(options.max_shard_bytes() > 0, "FolderWriter: the largest shard must be positive, got ",
              options.max_shard_bytes(), " bytes");
  made_folder_ = !fs::exists(folder);
  fs::create_directories(folder);
  // Until commit() writes them, the folder is not a model: a failed save
  // over an earlier one does not leave its config.json beside new weights.
  for (const char* stale : {"config.json", "model.safetensors.index.json"}) fs::remove(fs::path(folder) / stale);
  // save_pretrained's shards: in order, a new one where the next tensor
  // would pass the limit (a tensor over it alone in its own).
  const int64_t element = c10::elementSize(options.dtype());
  int64_t in_shard = 0;
  for (const auto& t : tensors) {
    // transformers would report them as unexpected keys and run the model without them.
    TORCH_CHECK(!lora::is_adapter_parameter(t.name), "FolderWriter: '", t.name,
                "' is a LoRA adapter's: a Hugging Face model folder holds none (merge them into the weights with "
                "peft::MergingWriter, fsdp-train --merge-lora; or write them apart with peft::AdapterWriter, "
                "fsdp-train --save-format peft)");
    names_.push_back(t.name);
    if (adapter.is_tied_head(config.model, t.name)) {  // GPT-2's files leave it out
      shard_of_.push_back(std::string::npos);
      continue;
    }
    int64_t bytes = element;
    for (int64_t d : t.shape) bytes *= d;
    if (shards_.empty() || (in_shard > 0 && in_shard + bytes > options.max_shard_bytes())) {
      shards_.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    shards_.back().push_back({adapter.to_hf_name(t.name), options.dtype(), hf_shape(adapter, t)});
    shard_of_.push_back(shards_.size() - 1);
  }
  if (shards_.empty()) shards_.emplace_back();
  for (size_t i = 0; i < shards_.size(); ++i) files_.push_back(shard_file_name(i, shards_.size()));
}

FolderWriter::~FolderWriter() {
  if (committed_ || !made_folder_) return;
  writer_.reset();  // its temporary file first
  std::error_code ignored;
  fs::remove_all(folder_, ignored);
}

void FolderWriter::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < names_.size(), "FolderWriter: more tensors written than the ", names_.size(), " listed");
  const size_t index = next_++;
  const size_t shard = shard_of_[index];
  if (shard == std::string::npos) return;  // a tied head
  const std::string& name = names_[index];
  if (!writer_) {
    writer_.emplace((fs::path(folder_) / files_[shard]).string(), shards_[shard],
                    std::map<std::string, std::string>{{"format", "pt"}});
    written_in_shard_ = 0;
  }
  torch::Tensor value = detail::finite_in_dtype(tensor, options_.dtype(), name, folder_);
  if (detail::adapter(config_.model.kind()).is_transposed(name)) value = value.t();
  writer_->write(value.contiguous());
  if (++written_in_shard_ == shards_[shard].size()) {
    writer_->commit();  // one shard open at a time
    writer_.reset();
  }
}

void FolderWriter::commit() {
  TORCH_CHECK(next_ == names_.size(), "FolderWriter: ", next_, " of ", names_.size(), " tensors written");
  const fs::path folder(folder_);
  if (writer_) {  // a shard of no tensors (a model without any): an empty file
    writer_->commit();
    writer_.reset();
  } else if (shards_.size() == 1 && shards_[0].empty()) {
    safetensors::Writer((folder / files_[0]).string(), {}, {{"format", "pt"}}).commit();
  }
  if (shards_.size() > 1) {  // save_pretrained's index: the weights' bytes, and each tensor's file
    json index{{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    int64_t total = 0;
    for (size_t i = 0; i < shards_.size(); ++i) {
      for (const auto& t : shards_[i]) {
        int64_t bytes = c10::elementSize(t.dtype);
        for (int64_t d : t.shape) bytes *= d;
        total += bytes;
        index["weight_map"][t.name] = files_[i];
      }
    }
    index["metadata"]["total_size"] = total;
    write_text_file(folder / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text_file(folder / "config.json", config_json(config_, options_.dtype()));
  // An earlier save's weight files that this one did not write (another
  // shard count) would be read as part of the model: removed.
  const std::set<std::string> mine(files_.begin(), files_.end());
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file_name(name) && !mine.count(name)) fs::remove(entry.path());
  }
  committed_ = true;
}

std::vector<std::string> copy_tokenizer_files(const std::string& from_folder, const std::string& to_folder) {
  // What save_pretrained writes beside the weights for the tokenizer, the
  // chat template and generation (transformers 4 and 5).
  static const char* const names[] = {"tokenizer.json",        "tokenizer_config.json", "special_tokens_map.json",
                                      "added_tokens.json",     "tokenizer.model",       "vocab.json",
                                      "merges.txt",            "chat_template.jinja",   "chat_template.json",
                                      "generation_config.json"};
  std::vector<std::string> copied;
  for (const char* name : names) {
    const fs::path from = fs::path(from_folder) / name;
    if (!fs::is_regular_file(from)) continue;
    fs::copy_file(from, fs::path(to_folder) / name, fs::copy_options::overwrite_existing);
    copied.push_back(name);
  }
  return copied;
}

void convert_file_to_hf(const std::string& spec_file, const HubConfig& config, const std::string& folder,
                        SaveOptions options) {
  safetensors::Reader reader(spec_file);
  if (reader.has_checksum()) reader.verify_checksum();
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& t : reader.tensors()) specs.push_back(t.spec);
  FolderWriter writer(folder, config, specs, options);
  for (const auto& t : reader.tensors()) writer.write(reader.read(t.spec.name));  // one tensor at a time
  writer.commit();
}

void convert_checkpoint_to_hf(const std::string& checkpoint, const HubConfig& config, const std::string& folder,
                              SaveOptions options) {
  SavedCheckpoint saved(checkpoint);
  FolderWriter writer(folder, config, saved.weight_specs(), options);
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
  check_tensors(hub, adapter, files, specs);
  safetensors::Writer writer(spec_file, specs,
                             {{"format", "pt"}, {"model", fsdp::enum_name(config.kind())}, {"config", config.describe()},
                              {"converted_from", hf_path}});
  for (const auto& s : specs) {  // one tensor at a time
    writer.write(read_in_model_layout(hub, by_name.at(s.name), adapter, s.name, torch::kFloat));
  }
  writer.commit();
}

namespace detail {

torch::Tensor finite_in_dtype(const torch::Tensor& tensor, torch::ScalarType dtype, const std::string& name,
                              const std::string& where) {
  torch::Tensor converted = tensor.to(dtype);
  if (!converted.is_floating_point() || torch::isfinite(converted).all().item<bool>()) return converted;
  const int64_t not_finite = tensor.numel() - torch::isfinite(tensor).sum().item<int64_t>();
  TORCH_CHECK(not_finite == 0, "'", where, "': tensor '", name, "' holds ", not_finite,
              " value(s) that are not finite (NaN or inf): refused, nothing written (the model computes NaN with "
              "them; where did they come from: an adapter or a checkpoint that holds them?)");
  const int64_t overflowed = converted.numel() - torch::isfinite(converted).sum().item<int64_t>();
  const double largest = dtype == torch::kHalf ? 65504.0 : std::numeric_limits<float>::max();
  TORCH_CHECK(false, "'", where, "': tensor '", name, "' has ", overflowed, " value(s) beyond ", dtype,
              "'s range (its largest magnitude is ", tensor.abs().max().item<double>(), "; ", dtype, " holds up to ",
              largest, "): written as ", dtype, " they would be inf. Refused, nothing written: save in float32 or "
              "bfloat16 (fsdp-train --save-dtype fp32 or bf16)");
}

}  // namespace detail

}  // namespace fsdp::hugging_face
