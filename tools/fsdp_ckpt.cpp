// fsdp-ckpt: look into checkpoints and weight files without starting ranks.
//   fsdp-ckpt inspect PATH          a checkpoint directory, a folder of them (--ckpt-dir) or a .safetensors file
//   fsdp-ckpt verify PATH           checksums, completeness, every tensor readable
//   fsdp-ckpt convert IN OUT        a checkpoint's weights as one full .safetensors file, or (--format hf)
//                                   a checkpoint or weight file as a Hugging Face folder, and a Hugging Face
//                                   model back (--format spec); one tensor or unit in memory at a time;
//                                   --save-dtype, --hf-shard-size and --source-model as fsdp-train's export
//   fsdp-ckpt logits MODEL          the model's next-token logits for --tokens, as JSON

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "fsdp/hugging_face.h"
#include "fsdp/state_dict.h"
#include "fsdp/safetensors.h"
#include "state_dict/checkpoint_json.h"  // metadata.json in full (src/, not installed)
#include "tool_support.h"
#include "state_dict/hugging_face_files.h"
#include "state_dict/safetensors_metadata.h"
#include "base/checksum.h"
#include "state_dict/checkpoint_schema.h"

namespace {

namespace fs = std::filesystem;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void inspect_checkpoint(const std::string& path) {
  fsdp::SavedCheckpoint saved(path);
  const nlohmann::json& m = saved.metadata().json;
  std::cout << fsdp::enum_name(saved.format()) << " checkpoint " << path << "\n"
            << "  step " << m.at("step") << ", saved by " << m.at("world_size") << " ranks with "
            << m.at("strategy").get<std::string>()
            << (saved.format() == fsdp::CheckpointFormat::kSharded
                    ? " (" + std::to_string(m.at("shard_group_size").get<int64_t>()) + " shards)"
                    : std::string())
            << ", optimizer " << m.at("optimizer").value("type", "adamw") << " step " << m.at("optimizer").at("step")
            << "\n";
  // Checkpoints from before other optimizers were supported hold AdamW's two moments.
  const nlohmann::json state = m.at("optimizer").value("state", nlohmann::json::array({"exp_avg", "exp_avg_sq"}));
  int64_t total = 0;
  std::cout << "  parameters (fp32 masters; the optimizer keeps " << (state.empty() ? "no state" : state.dump())
            << " of each):\n";
  for (const auto& unit : m.at("units")) {
    std::string name = unit.at("name").get<std::string>();
    std::cout << "    unit " << (name.empty() ? "<root>" : name) << ": " << unit.at("numel") << " elements"
              << (unit.value("frozen", false) ? " (frozen: no optimizer state)" : "") << "\n";
    for (const auto& p : unit.at("params")) {
      auto shape = p.at("shape").get<std::vector<int64_t>>();
      std::cout << "      " << std::left << std::setw(44) << p.at("name").get<std::string>() << " F32 "
                << shape_text(shape) << " " << 4 * numel_of(shape) << " B\n";
      total += numel_of(shape);
    }
  }
  std::cout << "  " << total << " parameters; files (size, checksum algorithm and checksum):\n";
  for (const auto& [file, checksum] : m.at("files").items()) {
    const fsdp::safetensors::Reader reader((fs::path(path) / file).string());  // the header only
    std::cout << "    " << file << " " << fs::file_size(fs::path(path) / file) << " B, "
              << fsdp::enum_name(reader.checksum_algorithm()) << " " << checksum.get<std::string>() << "\n";
  }
  std::cout << "    metadata.json " << fs::file_size(fs::path(path) / "metadata.json") << " B, "
            << m.value("checksum_algorithm", fsdp::enum_name(fsdp::checksum::kUnnamed)) << " "
            << m.at("checksum").get<std::string>() << "\n";
  if (!m.at("extra").empty()) std::cout << "  extra: " << m.at("extra").dump() << "\n";
}

// A checkpoint folder (fsdp-train --ckpt-dir): its step-N and step-N.tmp
// directories, newest first, one line each: name, complete or unfinished,
// then the layout or what is wrong.
void inspect_folder(const std::string& path, const std::vector<fsdp::CheckpointEntry>& entries) {
  std::cout << "checkpoint folder " << path << ": " << entries.size() << " checkpoint(s), newest first\n";
  for (const auto& e : entries) {
    std::cout << "  " << std::left << std::setw(16) << fs::path(e.path).filename().string() << std::setw(12)
              << (e.complete ? "complete" : "unfinished");
    if (e.complete) {
      std::cout << fsdp::enum_name(e.format) << ", step " << e.info.step << ", world size "
                << e.info.world_size << ", " << e.info.strategy << "\n";
    } else {
      std::cout << e.problem << "\n";
    }
  }
}

// A checkpoint (DIR/metadata.json), else a folder of them.
void inspect_directory(const std::string& path) {
  if (fs::exists(fs::path(path) / "metadata.json")) {
    inspect_checkpoint(path);
    return;
  }
  const auto entries = fsdp::list_checkpoints(path);
  TORCH_CHECK(!entries.empty(), "'", path, "' is not a complete checkpoint (it has no metadata.json) ",
              "nor a checkpoint folder (it holds no step-N directories)");
  inspect_folder(path, entries);
}

void inspect_file(const std::string& path) {
  fsdp::safetensors::Reader reader(path);
  std::cout << "safetensors file " << path << " (" << fs::file_size(path) << " B)\n";
  for (const auto& [key, value] : reader.metadata()) std::cout << "  metadata " << key << " = " << value << "\n";
  if (reader.has_checksum() && !reader.metadata().count(fsdp::safetensors::kChecksumAlgorithmKey)) {
    std::cout << "  checksum algorithm " << fsdp::enum_name(reader.checksum_algorithm())
              << " (the file names none: it was written before XXH3)\n";
  }
  int64_t elements = 0;
  for (const auto& t : reader.tensors()) {
    std::cout << "  " << std::left << std::setw(44) << t.spec.name << " " << fsdp::safetensors::dtype_code(t.spec.dtype)
              << " " << shape_text(t.spec.shape) << " " << t.end - t.begin << " B\n";
    elements += numel_of(t.spec.shape);
  }
  std::cout << "  " << reader.tensors().size() << " tensors, " << elements << " elements\n";
}

int verify(const std::string& path) {
  if (fs::is_directory(path)) {
    fsdp::SavedCheckpoint saved(path);  // checksums and presence of every file
    const auto& units = saved.metadata().json.at("units");
    for (size_t u = 0; u < units.size(); ++u) {
      const int64_t numel = units[u].at("numel").get<int64_t>();
      torch::Tensor scratch = torch::empty({numel});
      const bool frozen = units[u].value("frozen", false);  // its param alone: no optimizer state
      for (const char* what : {"param", "exp_avg", "exp_avg_sq"}) {
        if (what == std::string("param") || !frozen) saved.read_range(u, what, 0, numel, scratch);
      }
    }
    std::cout << "ok: " << path << ": " << saved.metadata().json.at("files").size() << " files, checksums match, "
              << units.size() << " units readable\n";
  } else {
    fsdp::safetensors::Reader reader(path);  // the header is fully validated
    if (reader.has_checksum()) reader.verify_checksum();
    for (const auto& t : reader.tensors()) reader.read(t.spec.name);
    std::cout << "ok: " << path << ": header valid, " << reader.tensors().size() << " tensors readable, "
              << (reader.has_checksum() ? "checksum matches" : "no checksum to verify (not written by fsdp-cpp)")
              << "\n";
  }
  return 0;
}

namespace hf = fsdp::hugging_face;

// The model configuration a checkpoint or a weight file of ours records
// ("config": describe()'s text; "model": gpt or llama, else told by the text).
fsdp::models::ModelConfig recorded_config(const std::string& path) {
  std::string text, model_type;
  if (fs::is_directory(path)) {
    const fsdp::SavedCheckpoint saved(path, fsdp::SavedCheckpoint::Verify::kHeadersOnly);
    const auto& extra = saved.info().extra;
    if (extra.count("config")) text = extra.at("config");
  } else {
    const fsdp::safetensors::Reader reader(path);
    if (reader.metadata().count("config")) text = reader.metadata().at("config");
    if (reader.metadata().count("model")) model_type = reader.metadata().at("model");
  }
  TORCH_CHECK(!text.empty(), "'", path, "' records no model configuration (\"config\"); fsdp-train writes it");
  if (model_type.empty()) model_type = text.find("kv_heads") != std::string::npos ? "llama" : "gpt";
  return fsdp::models::ModelConfig::parse(fsdp::parse_enum<fsdp::models::ModelKind>(model_type), text);
}

// How convert --format hf writes: --save-dtype, --hf-shard-size, --source-model.
struct HubExport {
  std::string save_dtype = "source", shard_size = "5GB", source_model;
};

// IN (a checkpoint, a weight file of ours, a Hugging Face model) to OUT in `format`.
void convert_weights(const std::string& in, const std::string& out, const std::string& format, const HubExport& e) {
  TORCH_CHECK(format == "spec" || format == "hf", "--format must be spec or hf, got '", format, "'");
  TORCH_CHECK(format == "hf" || (e.save_dtype == "source" && e.source_model.empty()),
              "--save-dtype and --source-model are for --format hf");
  if (format == "hf") {
    TORCH_CHECK(!hf::is_model(in), "'", in, "' is a Hugging Face model already");
    hf::SaveOptions options;  // the flags first: before anything is read
    options.max_shard_bytes(hf::parse_size(e.shard_size));
    if (e.save_dtype != "source") options.dtype(fsdp::parse_enum<torch::ScalarType>(e.save_dtype));
    hf::HubConfig config;
    config.model = recorded_config(in);
    if (!e.source_model.empty()) {  // the model it was fine-tuned from: its other config.json fields and dtype
      const hf::ModelFiles source = hf::find_model(e.source_model);
      config.source_json = hf::read_config(source.config).source_json;
      if (e.save_dtype == "source") options.dtype(hf::stored_dtype(source));
    }
    fs::is_directory(in) ? hf::convert_checkpoint_to_hf(in, config, out, options)
                         : hf::convert_file_to_hf(in, config, out, options);
    std::vector<std::string> copied;
    if (!e.source_model.empty()) copied = hf::copy_tokenizer_files(fs::path(hf::find_model(e.source_model).config).parent_path().string(), out);
    const hf::ModelFiles written = hf::find_model(out);
    std::cout << "wrote " << out << " (" << written.weights.size() << " weight file"
              << (written.weights.size() == 1 ? "" : "s") << ", " << written.weight_bytes() << " B, config.json";
    for (const std::string& name : copied) std::cout << ", " << name;
    std::cout << ")\n";
    return;
  }
  if (hf::is_model(in)) {
    hf::convert_hf_to_file(in, out);
  } else {
    fsdp::convert_to_full(in, out);
  }
  std::cout << "wrote " << out << " (" << fs::file_size(out) << " B)\n";
}

// The logits of one sequence, as JSON: {"tokens": [...], "logits": [[vocab floats] per token]}.
void print_logits(const std::string& path, const std::string& tokens_text) {
  std::vector<int64_t> tokens;
  std::stringstream in(tokens_text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used > 0 && used == item.size() && id >= 0, "--tokens: '", item,
                "' is not a token id (a whole number >= 0) in '", tokens_text, "'");
    tokens.push_back(id);
  }
  TORCH_CHECK(!tokens.empty(), "--tokens: expected comma-separated token ids, got '", tokens_text, "'");
  const bool is_hf = hf::is_model(path);
  const fsdp::models::ModelConfig config =
      is_hf ? hf::read_config(hf::find_model(path).config).model : recorded_config(path);
  const int64_t vocab = config.shape().vocab;
  for (const int64_t id : tokens) {
    TORCH_CHECK(id < vocab, "--tokens: id ", id, " is outside the model's vocabulary of ", vocab);
  }
  const auto model = config.new_model();
  is_hf ? hf::load_weights(*model, hf::find_model(path), config) : fsdp::load_full_weights(*model, path);
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model->logits(torch::tensor(tokens).view({1, -1}))[0].contiguous();
  const float* data = logits.data_ptr<float>();
  std::cout << std::setprecision(9) << "{\"tokens\": " << shape_text(tokens) << ", \"logits\": [";
  for (int64_t t = 0; t < logits.size(0); ++t) {
    std::cout << (t ? ",\n" : "\n") << "[";
    for (int64_t v = 0; v < logits.size(1); ++v) std::cout << (v ? ", " : "") << data[t * logits.size(1) + v];
    std::cout << "]";
  }
  std::cout << "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect, verify and convert fsdp-cpp checkpoints and weight files."};
  app.require_subcommand(1);
  std::string path, output, format = "spec", tokens;
  auto* inspect = app.add_subcommand("inspect",
                                     "tensors, shapes, dtypes, bytes, step, world size and strategy; of a folder, "
                                     "its checkpoints newest first, complete or unfinished");
  inspect->add_option("path", path, "checkpoint directory, folder of checkpoints (--ckpt-dir) or .safetensors file")
      ->required();
  auto* check = app.add_subcommand("verify", "checksums and completeness; every tensor read");
  check->add_option("path", path, "checkpoint directory or .safetensors file")->required();
  auto* convert = app.add_subcommand("convert",
                                     "a checkpoint's weights to one full .safetensors file, or any of ours to a "
                                     "Hugging Face folder (--format hf) and back (--format spec); offline, streaming");
  convert->add_option("input", path,
                      "checkpoint directory, .safetensors file of ours, or Hugging Face model (folder with "
                      "config.json and model.safetensors)")
      ->required();
  convert->add_option("output", output, "the .safetensors file (spec) or folder (hf) to write")->required();
  convert->add_option("--format", format, "spec: the spec's names, one file; hf: a Hugging Face folder")
      ->capture_default_str();
  HubExport hub_export;
  convert->add_option("--save-dtype", hub_export.save_dtype,
                      "--format hf: the weights' dtype, fp32, bf16 or fp16; source: --source-model's, else fp32")
      ->capture_default_str();
  convert->add_option("--hf-shard-size", hub_export.shard_size,
                      "--format hf: the largest weight file (\"5GB\", \"500MB\", \"2GiB\" or bytes); more weights "
                      "in shards with model.safetensors.index.json")
      ->capture_default_str();
  convert->add_option("--source-model", hub_export.source_model,
                      "--format hf: the Hugging Face model the weights were fine-tuned from: its config.json's other "
                      "fields (token ids, ...), its dtype, its tokenizer and chat template files");
  auto* logits = app.add_subcommand("logits", "the next-token logits of a token sequence, as JSON");
  logits->add_option("model", path, "a Hugging Face model, or a .safetensors file of ours")->required();
  logits->add_option("--tokens", tokens, "comma-separated token ids, such as 1,2,3")->required();
  if (const auto status = fsdp_tools::parse_command_line(app, argc, argv)) return *status;
  try {
    if (inspect->parsed()) {
      fs::is_directory(path) ? inspect_directory(path) : inspect_file(path);
    } else if (check->parsed()) {
      return verify(path);
    } else if (logits->parsed()) {
      print_logits(path, tokens);
    } else {
      convert_weights(path, output, format, hub_export);
    }
  } catch (const std::exception& e) {
    std::cerr << "fsdp-ckpt: error: " << fsdp::error_message(e) << "\n";
    return fsdp_tools::kExitError;
  }
  return fsdp_tools::kExitOk;
}
