// Checkpoints: writing either format, publishing it whole, and reading any
// layout back.

#include "fsdp/checkpoint.h"
#include "core/unit.h"
#include "state_dict/checkpoint_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <set>
#include <thread>

#include "fsdp/error.h"
#include "base/device_context.h"
#include "core/shard_offload.h"
#include "fsdp/optimizer_state.h"
#include "fsdp/state_dict.h"
#include "base/fault_injection.h"
#include "state_dict/staged_checkpoint.h"

namespace fsdp {
namespace fs = std::filesystem;
namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

const char* format_tag(CheckpointFormat format) {
  return format == CheckpointFormat::kSharded ? "fsdp-sharded-v1" : "fsdp-full-v1";
}

std::string shard_file(int64_t shard_index) { return "shard-" + std::to_string(shard_index) + ".safetensors"; }
std::string tensor_name(size_t unit, const std::string& what) { return "u" + std::to_string(unit) + "." + what; }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// "step-<N>" -> N; "step-<N>.tmp" -> N with *unfinished set; anything else -1.
int64_t step_of(const fs::path& p, bool* unfinished = nullptr) {
  std::string name = p.filename().string();
  const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
  if (tmp) name.resize(name.size() - 4);
  if (unfinished) *unfinished = tmp;
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (...) {
    return -1;
  }
}

nlohmann::json unit_layout(const FsdpState& state) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& unit : state.units()) {
    const FlatParam& flat = unit->flat_param();
    nlohmann::json params = nlohmann::json::array();
    for (const auto& e : flat.entries()) params.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
    units.push_back({{"name", unit->name()}, {"numel", flat.numel()}, {"shard_numel", flat.shard_numel()},
                     {"params", params}});
  }
  return units;
}

// What a checkpoint holds of every unit: "param" (the fp32 master), then
// the optimizer's element-wise state tensors. Checkpoints from before other
// optimizers were supported hold AdamW's two moments and say nothing.
std::vector<std::string> state_names(const nlohmann::json& meta) {
  std::vector<std::string> names = {"param"};
  const nlohmann::json& optimizer = meta.at("optimizer");
  if (optimizer.contains("state")) {
    for (const auto& name : optimizer.at("state")) names.push_back(name.get<std::string>());
  } else {
    names.insert(names.end(), {"exp_avg", "exp_avg_sq"});
  }
  return names;
}

using FileSpecs = std::vector<std::pair<std::string, std::vector<safetensors::TensorSpec>>>;

// Every file a checkpoint with this metadata holds, and its tensors.
FileSpecs expected_files(const nlohmann::json& meta, CheckpointFormat format) {
  const nlohmann::json& units = meta.at("units");
  FileSpecs files;
  if (format == CheckpointFormat::kSharded) {
    for (int64_t q = 0; q < meta.at("shard_group_size").get<int64_t>(); ++q) {
      std::vector<safetensors::TensorSpec> specs;
      for (size_t u = 0; u < units.size(); ++u) {
        const int64_t S = units[u].at("shard_numel").get<int64_t>();
        for (const auto& what : state_names(meta)) specs.push_back({tensor_name(u, what), torch::kFloat, {S}});
      }
      files.emplace_back(shard_file(q), std::move(specs));
    }
    return files;
  }
  const std::vector<std::string> names = state_names(meta);
  std::vector<safetensors::TensorSpec> params, moments;
  for (const auto& unit : units) {
    for (const auto& p : unit.at("params")) {
      const std::string name = p.at("name").get<std::string>();
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      params.push_back({name, torch::kFloat, shape});
      for (size_t k = 1; k < names.size(); ++k) {
        moments.push_back({optimizer_tensor_name(name, names[k]), torch::kFloat, shape});
      }
    }
  }
  files.emplace_back(kModelFile, std::move(params));
  files.emplace_back(kOptimizerFile, std::move(moments));
  return files;
}

// The checksum metadata.json carries: the hash of its text without it (the
// algorithm's name, kChecksumAlgorithmField, included), by that algorithm.
constexpr const char* kChecksumAlgorithmField = "checksum_algorithm";
std::string metadata_checksum(nlohmann::json metadata, checksum::Algorithm algorithm) {
  metadata.erase("checksum");
  const std::string text = metadata.dump(2);
  return safetensors::hex64(checksum::hash(algorithm, text.data(), text.size()));
}

// An integer of at least `min` (nullptr: absent). nlohmann keeps
// non-negative numbers as unsigned, which get<int64_t>() would wrap past 2^63.
int64_t integer_value(const nlohmann::json* value, int64_t min, const std::string& field, const std::string& file) {
  const bool fits = value && (value->is_number_unsigned()
                                  ? value->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                                  : value->is_number_integer());
  TORCH_CHECK(fits && value->get<int64_t>() >= min, "'", file, "': ", field, " must be an integer of at least ", min,
              ", found ", value ? value->dump() : "nothing");
  return value->get<int64_t>();
}

int64_t integer_field(const nlohmann::json& parent, const char* key, int64_t min, const std::string& field,
                      const std::string& file) {
  return integer_value(parent.contains(key) ? &parent[key] : nullptr, min, field, file);
}

void require_field(bool ok, const std::string& field, const char* what, const std::string& file) {
  TORCH_CHECK(ok, "'", file, "': ", field, " must be ", what);
}

// Every field of metadata.json that loading, resuming and the tools read,
// checked before any of them does: its type, and a layout FlatParam could
// have made (each unit's parameters back to back from offset 0, filling
// numel; shard_numel the sharded format's ceil(numel / shard_group_size)).
// The data files' tensor shapes are checked against this layout, so a
// malformed or hand-edited file is refused here, naming the field, rather
// than read as a layout that leaves elements unread or points past a tensor.
void check_layout(const nlohmann::json& meta, CheckpointFormat format, const std::string& file) {
  integer_field(meta, "step", 0, "step", file);
  integer_field(meta, "world_size", 1, "world_size", file);
  require_field(meta.contains("strategy") && meta["strategy"].is_string(), "strategy", "a string", file);
  const int64_t shard_group_size = integer_field(meta, "shard_group_size", 1, "shard_group_size", file);
  // null: a checkpoint saved with `{}` as its extra (nlohmann reads that as null).
  require_field(meta.contains("extra") && (meta["extra"].is_object() || meta["extra"].is_null()), "extra",
                "an object", file);
  require_field(meta.contains("files") && meta["files"].is_object(), "files", "an object", file);
  for (const auto& [name, checksum] : meta["files"].items()) {
    require_field(checksum.is_string(), "files." + name, "a string", file);
  }
  // One checksum per data file: this also bounds the files the layout makes
  // the reader expect by what the metadata lists.
  const int64_t file_count = format == CheckpointFormat::kSharded ? shard_group_size : 2;
  TORCH_CHECK(static_cast<int64_t>(meta["files"].size()) == file_count, "'", file, "': files lists ",
              meta["files"].size(), " files, the ", checkpoint_format_name(format), " format with shard_group_size ",
              shard_group_size, " has ", file_count);
  require_field(meta.contains("optimizer") && meta["optimizer"].is_object(), "optimizer", "an object", file);
  const nlohmann::json& optimizer = meta["optimizer"];
  integer_field(optimizer, "step", 0, "optimizer.step", file);
  require_field(!optimizer.contains("type") || optimizer["type"].is_string(), "optimizer.type", "a string", file);
  require_field(!optimizer.contains("has_state") || optimizer["has_state"].is_boolean(), "optimizer.has_state",
                "true or false", file);
  if (optimizer.contains("state")) {
    const nlohmann::json& state = optimizer["state"];
    require_field(state.is_array() && std::all_of(state.begin(), state.end(), [](const auto& n) { return n.is_string(); }),
                  "optimizer.state", "an array of strings", file);
  }
  require_field(meta.contains("units") && meta["units"].is_array(), "units", "an array", file);
  const nlohmann::json& units = meta["units"];
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string unit_field = "units[" + std::to_string(u) + "]";
    const nlohmann::json& unit = units[u];
    require_field(unit.is_object(), unit_field, "an object", file);
    require_field(unit.contains("name") && unit["name"].is_string(), unit_field + ".name", "a string", file);
    const int64_t numel = integer_field(unit, "numel", 0, unit_field + ".numel", file);
    const int64_t shard_numel = integer_field(unit, "shard_numel", 0, unit_field + ".shard_numel", file);
    require_field(unit.contains("params") && unit["params"].is_array(), unit_field + ".params", "an array", file);
    int64_t packed = 0;  // elements of the parameters before this one
    for (size_t k = 0; k < unit["params"].size(); ++k) {
      const std::string field = unit_field + ".params[" + std::to_string(k) + "]";
      const nlohmann::json& p = unit["params"][k];
      require_field(p.is_object(), field, "an object", file);
      require_field(p.contains("name") && p["name"].is_string(), field + ".name", "a string", file);
      require_field(p.contains("shape") && p["shape"].is_array(), field + ".shape", "an array", file);
      int64_t elements = 1;
      for (size_t d = 0; d < p["shape"].size(); ++d) {
        const int64_t size = integer_value(&p["shape"][d], 0, field + ".shape[" + std::to_string(d) + "]", file);
        TORCH_CHECK(size == 0 || elements <= (numel - packed) / size, "'", file, "': ", field, " (shape ",
                    p["shape"].dump(), ") does not fit the ", numel, " elements of ", unit_field);
        elements *= size;
      }
      const int64_t offset = integer_field(p, "offset", 0, field + ".offset", file);
      TORCH_CHECK(offset == packed, "'", file, "': ", field, " starts at offset ", offset, ", expected ", packed,
                  " (parameters lie back to back in their unit's flat buffer)");
      packed += elements;
    }
    TORCH_CHECK(packed == numel, "'", file, "': the parameters of ", unit_field, " hold ", packed,
                " elements, its numel says ", numel);
    if (format == CheckpointFormat::kSharded) {
      const int64_t expected = numel / shard_group_size + (numel % shard_group_size != 0);
      TORCH_CHECK(shard_numel == expected, "'", file, "': ", unit_field, ".shard_numel is ", shard_numel, ", but ",
                  numel, " elements in ", shard_group_size, " shards make shards of ", expected);
    }
  }
}

// The metadata.json of the checkpoint at `path`, checked without opening a
// data file: valid JSON, a known format, its own checksum matching, and a
// well-formed layout (check_layout).
nlohmann::json read_metadata(const std::string& path, CheckpointFormat* format) {
  const fs::path meta_path = fs::path(path) / "metadata.json";
  nlohmann::json metadata;
  {
    std::ifstream in(meta_path);
    TORCH_CHECK(in, "'", path, "' is not a complete checkpoint: it has no metadata.json");
    try {
      in >> metadata;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "'", meta_path.string(), "' is not valid JSON: ", e.what());
    }
  }
  // Fields of another type read as absent (value() would throw json's error).
  const auto string_field = [&](const char* key) {
    return metadata.is_object() && metadata.contains(key) && metadata[key].is_string() ? metadata[key].get<std::string>()
                                                                                       : std::string();
  };
  const std::string tag = string_field("format");
  TORCH_CHECK(tag == format_tag(CheckpointFormat::kSharded) || tag == format_tag(CheckpointFormat::kFull), "'", path,
              "' is not an fsdp checkpoint (format '", tag, "', expected '", format_tag(CheckpointFormat::kSharded),
              "' or '", format_tag(CheckpointFormat::kFull), "')");
  *format = tag == format_tag(CheckpointFormat::kSharded) ? CheckpointFormat::kSharded : CheckpointFormat::kFull;
  // None named: written before algorithms were named (checksum::kUnnamed).
  const bool named = metadata.contains(kChecksumAlgorithmField);
  require_field(!named || metadata[kChecksumAlgorithmField].is_string(), kChecksumAlgorithmField, "a string",
                meta_path.string());
  const checksum::Algorithm algorithm =
      named ? checksum::parse_algorithm(string_field(kChecksumAlgorithmField), meta_path.string()) : checksum::kUnnamed;
  const std::string stored = string_field("checksum");
  const std::string found = metadata_checksum(metadata, algorithm);
  TORCH_CHECK(stored == found, "'", meta_path.string(), "' is corrupt: its contents have checksum ", found,
              ", it says '", stored, "'");
  check_layout(metadata, *format, meta_path.string());
  return metadata;
}

// Collective: if any rank failed, every rank throws the message of the
// lowest failing rank, so that a job stopped by one rank's finding (a
// corrupt file only that rank read) prints it once rather than once per rank.
void throw_first_rank_error(const ProcessGroupPtr& group, const std::string& error) {
  const int world = group->size();
  torch::Tensor lengths = torch::empty({world}, torch::kLong);
  group->all_gather(lengths, torch::tensor({static_cast<int64_t>(error.size())}, torch::kLong))->wait();
  const auto* length = lengths.data_ptr<int64_t>();
  const int first = static_cast<int>(std::find_if(length, length + world, [](int64_t n) { return n > 0; }) - length);
  if (first == world) return;
  torch::Tensor text = torch::empty({length[first]}, torch::kByte);
  if (group->rank() == first) std::memcpy(text.data_ptr(), error.data(), error.size());
  group->broadcast(text, first)->wait();
  TORCH_CHECK(false, std::string(reinterpret_cast<const char*>(text.data_ptr()), static_cast<size_t>(length[first])));
}

// Writes this rank's shard file of a sharded checkpoint (if it is a writer).
void write_shard_file(FsdpState& state, const OptimizerState& optimizer, const nlohmann::json& meta,
                      const fs::path& temp_dir) {
  // One writer per shard: the ranks of the first replica (all ranks unless
  // the strategy replicates shards across ranks or nodes).
  if (state.replicate_group() && state.replicate_group()->rank() != 0) return;
  const int64_t shard_index = state.shard_group() ? state.shard_group()->rank() : 0;
  auto [name, specs] = expected_files(meta, CheckpointFormat::kSharded).at(shard_index);
  safetensors::Writer writer((temp_dir / name).string(), std::move(specs),
                             {{"format", format_tag(CheckpointFormat::kSharded)}, {"shard", std::to_string(shard_index)}});
  for (size_t u = 0; u < state.units().size(); ++u) {
    ResidentScope resident(state, *state.units()[u], &optimizer.optimizer());
    const torch::Tensor& shard = state.units()[u]->flat_param().shard();
    writer.write(shard.detach());
    for (const auto& name : optimizer.tensor_names()) writer.write(optimizer.value(shard, name));
    if (u == 0) detail::maybe_kill_for_test(state.group()->rank());
  }
  writer.commit();
}

}  // namespace

std::string checkpoint_format_name(CheckpointFormat format) {
  return format == CheckpointFormat::kSharded ? "sharded" : "full";
}

CheckpointFormat parse_checkpoint_format(const std::string& name) {
  if (name == "sharded") return CheckpointFormat::kSharded;
  if (name == "full") return CheckpointFormat::kFull;
  TORCH_CHECK(false, "unknown checkpoint format '", name, "' (expected sharded or full)");
}

void write_checkpoint_metadata(const std::string& dir, nlohmann::json metadata) {
  metadata[kChecksumAlgorithmField] = checksum::algorithm_name(checksum::kWritten);
  metadata["checksum"] = metadata_checksum(metadata, checksum::kWritten);
  const fs::path temp = fs::path(dir) / "metadata.json.tmp";
  {
    std::ofstream out(temp);
    out << metadata.dump(2) << "\n";
    out.flush();
    TORCH_CHECK(out.good(), "writing '", temp.string(), "' failed");
  }
  fsync_path(temp);
  fs::rename(temp, fs::path(dir) / "metadata.json");
}

nlohmann::json extra_to_json(const CheckpointExtra& extra) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [key, text] : extra) {
    object[key] = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    TORCH_CHECK(!object[key].is_discarded(), "save_checkpoint: extra '", key, "' must be JSON text, got '", text, "'");
  }
  return object;
}

CheckpointExtra extra_from_json(const nlohmann::json& extra) {
  CheckpointExtra texts;
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) texts[key] = value.dump();
  }
  return texts;
}

CheckpointInfo checkpoint_info(const nlohmann::json& metadata, const std::string& path, CheckpointFormat format) {
  CheckpointInfo info;
  info.path = path;
  info.format = format;
  info.step = metadata.at("step").get<int64_t>();
  info.world_size = metadata.at("world_size").get<int64_t>();
  info.strategy = metadata.at("strategy").get<std::string>();
  info.optimizer_type = metadata.at("optimizer").value("type", "adamw");
  info.extra = extra_from_json(metadata.at("extra"));
  return info;
}

namespace {

// Collective: rank 0 makes DIR and an empty DIR/step-N.tmp (an unfinished
// earlier attempt removed).
void prepare_temp_dir(const ProcessGroupPtr& group, const std::string& dir, const fs::path& temp_dir) {
  std::string error;
  if (group->rank() == 0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(temp_dir);
      fs::create_directories(temp_dir);
    } catch (const std::exception& e) {
      error = "cannot prepare checkpoint directory '" + temp_dir.string() + "': " + e.what();
    }
  }
  throw_if_any_rank_failed(group, error);
}

// metadata.json's fields but "files", as they stand now.
nlohmann::json checkpoint_metadata(const FsdpState& state, const OptimizerState& optimizer_state, int64_t step,
                                   const CheckpointExtra& extra_texts, CheckpointFormat format) {
  const torch::Tensor first_shard = state.units().front()->flat_param().shard();
  nlohmann::json optimizer_meta = {{"type", optimizer_state.type()},
                                   {"step", optimizer_state.step(first_shard)},
                                   {"state", optimizer_state.tensor_names()},
                                   {"has_state", optimizer_state.has_state(first_shard)}};
  return {{"format", format_tag(format)},
          {"step", step},
          {"world_size", state.group()->size()},
          {"strategy", strategy_name(state.options().strategy())},
          {"shard_group_size", state.shard_group() ? state.shard_group()->size() : 1},
          {"optimizer", optimizer_meta},
          {"units", unit_layout(state)},
          {"extra", extra_to_json(extra_texts)}};
}

// Rank 0, once every file is whole: records their checksums, writes
// metadata.json and renames the folder into place. Returns the error ("" if none).
std::string publish_on_rank0(nlohmann::json meta, CheckpointFormat format, const std::string& dir,
                             const fs::path& temp_dir, const fs::path& final_dir) {
  try {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [name, specs] : expected_files(meta, format)) {
      files[name] = safetensors::hex64(safetensors::Reader((temp_dir / name).string()).stored_checksum());
    }
    meta["files"] = files;
    write_checkpoint_metadata(temp_dir.string(), meta);
    fsync_path(temp_dir);
    fs::remove_all(final_dir);  // a complete checkpoint of the same step is replaced
    fs::rename(temp_dir, final_dir);
    fsync_path(dir);
  } catch (const std::exception& e) {
    return "publishing checkpoint '" + final_dir.string() + "' failed: " + error_message(e);
  }
  return "";
}

}  // namespace

std::string save_checkpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& dir, int64_t step,
                            const CheckpointExtra& extra_texts, CheckpointFormat format) {
  state.check_idle();
  const OptimizerState optimizer_state(optimizer);
  nlohmann::json meta = checkpoint_metadata(state, optimizer_state, step, extra_texts, format);
  const ProcessGroupPtr& group = state.group();
  const fs::path final_dir = fs::path(dir) / ("step-" + std::to_string(step));
  const fs::path temp_dir = fs::path(dir) / ("step-" + std::to_string(step) + ".tmp");
  prepare_temp_dir(group, dir, temp_dir);
  std::string error;
  if (format == CheckpointFormat::kSharded) {
    try {
      write_shard_file(state, optimizer_state, meta, temp_dir);
    } catch (const std::exception& e) {
      error = "rank " + std::to_string(group->rank()) + ": " + error_message(e);
    }
    throw_if_any_rank_failed(group, error);
  } else {
    save_full_state_dict(state, (temp_dir / kModelFile).string(), {{"format", "pt"}}, &optimizer,
                         (temp_dir / kOptimizerFile).string());
  }
  // Every file is whole: rank 0 records their checksums and publishes.
  group->barrier()->wait();
  if (group->rank() == 0) error = publish_on_rank0(std::move(meta), format, dir, temp_dir, final_dir);
  throw_if_any_rank_failed(group, error);
  return final_dir.string();
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// A host copy of `tensor` that training cannot change (a device tensor copied over).
torch::Tensor staged_copy(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

// The memory the tensors hold: each storage once (the full format's are
// views of a unit's gathered buffer, padding included).
int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (seen.insert(t.storage().data()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

// The host buffers of the sharded format's staging copies, in the order
// copied, kept from one save to the next: a fresh buffer costs a page fault
// per page on first touch (large at W = 2: 910 MB a rank, staged in 0.8-3.1 s
// into fresh pages against 0.92 s for the whole synchronous save), a reused
// one is a plain copy.
struct StagingBuffers {
  std::vector<torch::Tensor> buffers;
  size_t next = 0;
  torch::Tensor copy(const torch::Tensor& tensor) {
    if (next < buffers.size() && buffers[next].sizes() == tensor.sizes() &&
        buffers[next].scalar_type() == tensor.scalar_type()) {
      buffers[next].copy_(tensor.detach());
    } else if (next < buffers.size()) {
      buffers[next] = staged_copy(tensor);
    } else {
      buffers.push_back(staged_copy(tensor));
    }
    return buffers[next++];
  }
};

// The sharded format: this rank's shard file, as write_shard_file writes it
// (nothing for a rank of another replica).
std::vector<StagedCheckpoint::File> stage_shard_file(FsdpState& state, const OptimizerState& optimizer,
                                                     const nlohmann::json& meta, const fs::path& temp_dir,
                                                     StagingBuffers& staging) {
  if (state.replicate_group() && state.replicate_group()->rank() != 0) return {};
  const int64_t shard_index = state.shard_group() ? state.shard_group()->rank() : 0;
  auto [name, specs] = expected_files(meta, CheckpointFormat::kSharded).at(shard_index);
  const std::map<std::string, std::string> header = {{"format", format_tag(CheckpointFormat::kSharded)},
                                                     {"shard", std::to_string(shard_index)}};
  StagedCheckpoint::File file{(temp_dir / name).string(), std::move(specs), header, {}};
  for (size_t u = 0; u < state.units().size(); ++u) {
    ResidentScope resident(state, *state.units()[u], &optimizer.optimizer());
    const torch::Tensor& shard = state.units()[u]->flat_param().shard();
    file.tensors.push_back(staging.copy(shard));
    for (const auto& tensor : optimizer.tensor_names()) {
      file.tensors.push_back(staging.copy(optimizer.value(shard, tensor)));
    }
  }
  return {std::move(file)};
}

// The full format, collective: every unit's parameters and optimizer state
// gathered to rank 0, which keeps them in the order save_full_state_dict
// writes model.safetensors and optimizer.safetensors (the same headers too).
std::vector<StagedCheckpoint::File> stage_full_files(FsdpState& state, const OptimizerState& optimizer,
                                                     const fs::path& temp_dir) {
  const bool writer = state.group()->rank() == 0;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  auto optimizer_metadata = metadata;
  optimizer_metadata["optimizer"] = optimizer.type();
  optimizer_metadata["optimizer_step"] = std::to_string(optimizer.step(state.units().front()->flat_param().shard()));
  StagedCheckpoint::File model{(temp_dir / kModelFile).string(), {}, metadata, {}};
  StagedCheckpoint::File moments{(temp_dir / kOptimizerFile).string(), {}, optimizer_metadata, {}};
  auto keep = [&](const FlatParam& flat, const torch::Tensor& local, StagedCheckpoint::File& file,
                  const char* state_name) {
    torch::Tensor full = flat.gather_full(local);
    if (!writer) return;
    // no_shard's gather_full is the shard itself: copied, as is a device tensor.
    full = full.is_alias_of(local) || !full.is_cpu() ? staged_copy(full) : full;
    for (const auto& e : flat.entries()) {
      const std::string name = state_name ? optimizer_tensor_name(e.name, state_name) : e.name;
      file.specs.push_back({name, torch::kFloat, e.shape});
      file.tensors.push_back(full.narrow(0, e.offset, e.numel).view(e.shape));
    }
  };
  for (size_t u = 0; u < state.units().size(); ++u) {
    const FlatParam& flat = state.units()[u]->flat_param();
    ResidentScope resident(state, *state.units()[u], &optimizer.optimizer(), /*agree=*/true);
    keep(flat, flat.shard(), model, nullptr);  // the fp32 masters
    for (const auto& name : optimizer.tensor_names()) {
      keep(flat, optimizer.value(flat.shard(), name), moments, name.c_str());
    }
  }
  if (!writer) return {};
  return {std::move(model), std::move(moments)};
}

}  // namespace

StagedCheckpoint::StagedCheckpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& dir,
                                   int64_t step, const CheckpointExtra& extra, CheckpointFormat format,
                                   std::vector<torch::Tensor> reuse)
    : rank_(state.group()->rank()),
      dir_(dir),
      temp_dir_((fs::path(dir) / ("step-" + std::to_string(step) + ".tmp")).string()),
      final_dir_((fs::path(dir) / ("step-" + std::to_string(step))).string()),
      format_(format) {
  state.check_idle();
  const OptimizerState optimizer_state(optimizer);
  const nlohmann::json meta = checkpoint_metadata(state, optimizer_state, step, extra, format);
  metadata_json_ = meta.dump();
  prepare_temp_dir(state.group(), dir, temp_dir_);
  std::string error;
  try {
    torch::NoGradGuard no_grad;
    StagingBuffers staging{std::move(reuse)};
    files_ = format == CheckpointFormat::kSharded ? stage_shard_file(state, optimizer_state, meta, temp_dir_, staging)
                                                  : stage_full_files(state, optimizer_state, temp_dir_);
    staging.buffers.resize(staging.next);
    buffers_ = std::move(staging.buffers);
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank_) + ": staging checkpoint '" + final_dir_ + "': " + error_message(e);
  }
  throw_if_any_rank_failed(state.group(), error);
  for (const auto& file : files_) staged_bytes_ += bytes_of(file.tensors);
  writer_ = std::thread([this] { write_files(); });
}

StagedCheckpoint::~StagedCheckpoint() {
  if (writer_.joinable()) writer_.join();
}

void StagedCheckpoint::write_files() {
  const auto start = Clock::now();
  try {
    maybe_delay_background_write_for_test();
    if (files_.empty()) maybe_kill_for_test(rank_);  // this rank's save, as a synchronous one counts it
    for (auto& file : files_) {
      safetensors::Writer writer(file.path, file.specs, file.metadata);
      for (size_t i = 0; i < file.tensors.size(); ++i) {
        writer.write(file.tensors[i]);
        file.tensors[i] = torch::Tensor();  // its memory back as soon as it is written
        if (i == 0 && &file == &files_.front()) maybe_kill_for_test(rank_);
      }
      writer.commit();
    }
  } catch (const std::exception& e) {
    error_ = error_message(e);
  }
  files_.clear();
  write_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  written_ = true;
}

bool StagedCheckpoint::written_everywhere(const ProcessGroupPtr& group) const {
  torch::Tensor unfinished = torch::tensor({written_.load() ? 0 : 1}, torch::kInt);
  group->all_reduce(unfinished, ReduceOp::kSum)->wait();
  return unfinished.item<int>() == 0;
}

double StagedCheckpoint::publish(const ProcessGroupPtr& group) {
  if (writer_.joinable()) writer_.join();
  throw_first_rank_error(group, error_.empty() ? "" : "checkpoint '" + final_dir_ +
                                                           "': the background write failed on rank " +
                                                           std::to_string(rank_) + ": " + error_);
  torch::Tensor seconds = torch::empty({group->size()}, torch::kDouble);
  group->all_gather(seconds, torch::tensor({write_seconds_}, torch::kDouble))->wait();
  std::string error;
  if (group->rank() == 0) {
    error = publish_on_rank0(nlohmann::json::parse(metadata_json_), format_, dir_, temp_dir_, final_dir_);
  }
  throw_if_any_rank_failed(group, error);
  return seconds.max().item<double>();
}

void maybe_delay_background_write_for_test() {
  const char* delay = std::getenv("FSDP_TEST_BACKGROUND_WRITE_DELAY_MS");
  if (delay && std::atoi(delay) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(delay)));
}

}  // namespace detail

std::string latest_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return "";
  fs::path best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir)) {
    bool unfinished = false;
    const int64_t step = step_of(entry.path(), &unfinished);
    if (!unfinished && step > best_step && fs::exists(entry.path() / "metadata.json")) {
      best_step = step;
      best = entry.path();
    }
  }
  return best.string();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointEntry> entries;
  if (!fs::is_directory(dir)) return entries;
  for (const auto& item : fs::directory_iterator(dir)) {
    CheckpointEntry entry;
    bool unfinished = false;
    entry.step = step_of(item.path(), &unfinished);
    if (entry.step < 0 || !item.is_directory()) continue;
    entry.path = item.path().string();
    if (unfinished) {
      entry.problem = "a save that did not finish (never renamed to step-" + std::to_string(entry.step) + ")";
    } else {
      try {
        auto metadata = std::make_shared<CheckpointMetadata>();
        metadata->json = read_metadata(entry.path, &entry.format);
        entry.info = checkpoint_info(metadata->json, entry.path, entry.format);
        entry.metadata = std::move(metadata);
        entry.complete = true;
      } catch (const std::exception& e) {
        entry.problem = error_message(e);
      }
    }
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    if (a.step != b.step) return a.step > b.step;
    if (a.complete != b.complete) return a.complete;
    return a.path < b.path;
  });
  return entries;
}

void prune_checkpoints(const std::string& dir, int keep) {
  if (keep <= 0 || !fs::is_directory(dir)) return;
  std::vector<std::pair<int64_t, fs::path>> complete, unfinished;
  for (const auto& entry : fs::directory_iterator(dir)) {
    bool tmp = false;
    const int64_t step = step_of(entry.path(), &tmp);
    if (step < 0) continue;
    if (tmp) {
      unfinished.emplace_back(step, entry.path());
    } else if (fs::exists(entry.path() / "metadata.json")) {
      complete.emplace_back(step, entry.path());
    }
  }
  if (complete.empty()) return;
  std::sort(complete.rbegin(), complete.rend());
  for (size_t i = static_cast<size_t>(keep); i < complete.size(); ++i) fs::remove_all(complete[i].second);
  for (const auto& [step, path] : unfinished) {
    if (step < complete.front().first) fs::remove_all(path);
  }
}

SavedCheckpoint::SavedCheckpoint(const std::string& path, Verify verify) : path_(path) {
  const fs::path dir(path);
  auto metadata = std::make_shared<CheckpointMetadata>();
  metadata->json = read_metadata(path, &format_);
  metadata_ = metadata;
  info_ = checkpoint_info(metadata->json, path, format_);
  const nlohmann::json& meta = metadata->json;
  // Every file the layout calls for: present, intact, listed, and holding
  // exactly the tensors the layout describes.
  for (const auto& [name, specs] : expected_files(meta, format_)) {
    const fs::path file = dir / name;
    TORCH_CHECK(fs::exists(file), "checkpoint '", path, "' is missing '", name, "'");
    auto reader = std::make_unique<safetensors::Reader>(file.string());
    TORCH_CHECK(reader->has_checksum(), "'", file.string(), "' carries no checksum");
    const std::string listed = meta.at("files").value(name, "");
    TORCH_CHECK(safetensors::hex64(reader->stored_checksum()) == listed, "'", file.string(), "' has checksum ",
                safetensors::hex64(reader->stored_checksum()), ", the metadata lists '", listed,
                "' (a file of another checkpoint?)");
    for (const auto& spec : specs) {
      const safetensors::TensorEntry* entry = reader->find(spec.name);
      TORCH_CHECK(entry, "'", file.string(), "' has no tensor '", spec.name, "'");
      TORCH_CHECK(entry->spec.dtype == spec.dtype && entry->spec.shape == spec.shape, "'", file.string(),
                  "': tensor '", spec.name, "' is ", entry->spec.dtype, " of shape ", c10::IntArrayRef(entry->spec.shape),
                  ", expected ", spec.dtype, " of shape ", c10::IntArrayRef(spec.shape));
    }
    if (reader->tensors().size() != specs.size()) {
      for (const auto& t : reader->tensors()) {
        const bool known = std::any_of(specs.begin(), specs.end(), [&](const auto& s) { return s.name == t.spec.name; });
        TORCH_CHECK(known, "'", file.string(), "' has a tensor '", t.spec.name, "' that the checkpoint's layout does not have");
      }
    }
    readers_[name] = std::move(reader);
    file_names_.push_back(name);
  }
  if (verify == Verify::kEveryFile) verify_files_in_parallel();
}

SavedCheckpoint::~SavedCheckpoint() = default;

void SavedCheckpoint::verify_file(const std::string& name) const {
  auto reader = readers_.find(name);
  TORCH_CHECK(reader != readers_.end(), "checkpoint '", path_, "' has no data file '", name, "'");
  reader->second->verify_checksum();
}

void SavedCheckpoint::verify_files_in_parallel() const {
  // Workers take the files in order; the error reported is the first file's
  // in that order, whichever worker finds it first.
  const size_t workers = std::min<size_t>(file_names_.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> errors(file_names_.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < file_names_.size(); i = next++) {
      try {
        verify_file(file_names_[i]);
      } catch (const std::exception& e) {
        errors[i] = error_message(e);
      }
    }
  };
  std::vector<std::future<void>> running;
  for (size_t w = 1; w < workers; ++w) running.push_back(std::async(std::launch::async, work));
  work();
  for (auto& r : running) r.get();
  for (const auto& error : errors) TORCH_CHECK(error.empty(), error);
}

void SavedCheckpoint::read_range(size_t unit, const std::string& what, int64_t from, int64_t to,
                                 const torch::Tensor& out) const {
  const nlohmann::json& meta = metadata_->json;
  const nlohmann::json& units = meta.at("units");
  TORCH_CHECK(unit < units.size(), "checkpoint '", path_, "' has ", units.size(), " units, asked for unit ", unit);
  const std::vector<std::string> names = state_names(meta);
  TORCH_CHECK(std::find(names.begin(), names.end(), what) != names.end(), "read_range: checkpoint '", path_,
              "' holds no state '", what, "' (it holds ", nlohmann::json(names).dump(), ")");
  TORCH_CHECK(0 <= from && from <= to && to <= units[unit].at("numel").get<int64_t>() && out.numel() == to - from,
              "read_range: [", from, ", ", to, ") does not fit unit ", unit, " or the output of ", out.numel());
  if (!in_host_memory(out)) {  // a GPU run's shard: read on the host, then copied over
    torch::Tensor host = torch::empty(out.sizes(), out.options().device(torch::kCPU));
    read_range(unit, what, from, to, host);
    out.copy_(host);
    return;
  }
  // The saved pieces: (file, tensor, flat offset of its first element, elements).
  std::vector<std::tuple<std::string, std::string, int64_t, int64_t>> pieces;
  if (format_ == CheckpointFormat::kSharded) {
    const int64_t S = units[unit].at("shard_numel").get<int64_t>();
    for (int64_t q = 0; q < meta.at("shard_group_size").get<int64_t>(); ++q) {
      pieces.emplace_back(shard_file(q), tensor_name(unit, what), q * S, S);
    }
  } else {
    for (const auto& p : units[unit].at("params")) {
      const std::string name = p.at("name").get<std::string>();
      pieces.emplace_back(what == "param" ? kModelFile : kOptimizerFile,
                          what == "param" ? name : optimizer_tensor_name(name, what), p.at("offset").get<int64_t>(),
                          numel_of(p.at("shape").get<std::vector<int64_t>>()));
    }
  }
  for (const auto& [file, name, offset, numel] : pieces) {
    const int64_t lo = std::max(from, offset), hi = std::min(to, offset + numel);
    if (lo < hi) readers_.at(file)->read_into(name, lo - offset, out.narrow(0, lo - from, hi - lo));
  }
}

CheckpointInfo load_checkpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& path) {
  state.check_idle();
  OptimizerState optimizer_state(optimizer);
  SavedCheckpoint saved(path, SavedCheckpoint::Verify::kHeadersOnly);
  const nlohmann::json& meta = saved.metadata().json;
  // The model must be the one saved: same units, same parameters, same shapes.
  const nlohmann::json& saved_units = meta.at("units");
  const nlohmann::json our_units = unit_layout(state);
  TORCH_CHECK(saved_units.size() == our_units.size(), "checkpoint '", path, "' holds ", saved_units.size(),
              " units, this model has ", our_units.size(), " (another model configuration or wrap policy)");
  for (size_t u = 0; u < our_units.size(); ++u) {
    TORCH_CHECK(saved_units[u].at("params") == our_units[u].at("params"), "checkpoint '", path, "': unit '",
                our_units[u].at("name").get<std::string>(), "' was saved with other parameters or shapes ",
                "(another model configuration): saved ", saved_units[u].at("params").dump(), ", model has ",
                our_units[u].at("params").dump());
  }
  // The optimizer must keep the state that was saved (Adam and AdamW keep
  // the same; SGD with momentum another).
  const std::vector<std::string> saved_names = state_names(meta);
  const std::vector<std::string> our_names(saved_names.begin() + 1, saved_names.end());
  TORCH_CHECK(our_names == optimizer_state.tensor_names(), "checkpoint '", path, "' holds the state of optimizer '",
              meta.at("optimizer").value("type", "adamw"), "' (", nlohmann::json(our_names).dump(), "), but ",
              optimizer_name(optimizer), " keeps ", nlohmann::json(optimizer_state.tensor_names()).dump());
  // Every data file's bytes, verified before any state changes: the i-th
  // file by rank i mod W, the ranks in parallel, rather than every rank
  // reading every file (a rank reads the files its ranges lie in afterwards,
  // from the page cache when it or another rank of the host verified them).
  const ProcessGroupPtr& group = state.group();
  std::string error;
  try {
    const std::vector<std::string>& files = saved.file_names();
    for (size_t i = group->rank(); i < files.size(); i += group->size()) saved.verify_file(files[i]);
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  throw_first_rank_error(group, error);
  const int64_t optimizer_step = meta.at("optimizer").at("step").get<int64_t>();
  const bool has_state = meta.at("optimizer").value("has_state", true);
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < state.units().size(); ++u) {
    FlatParam& flat = state.units()[u]->flat_param();
    ResidentScope resident(state, *state.units()[u], &optimizer);
    // This rank's new shard covers [begin, end) of the real elements; the
    // padding after them stays zero.
    const int64_t begin = std::min(flat.shard_rank() * flat.shard_numel(), flat.numel());
    const int64_t end = std::min(begin + flat.shard_numel(), flat.numel());
    std::vector<torch::Tensor> targets = {flat.shard().detach()};
    if (has_state) {
      for (const auto& name : our_names) targets.push_back(optimizer_state.tensor(flat.shard(), name));
      optimizer_state.set_step(flat.shard(), optimizer_step);
    } else {
      optimizer_state.clear(flat.shard());  // saved before its first step: it starts afresh
    }
    for (size_t k = 0; k < targets.size(); ++k) {
      targets[k].narrow(0, end - begin, targets[k].numel() - (end - begin)).zero_();  // the padding
      saved.read_range(u, saved_names[k], begin, end, targets[k].narrow(0, 0, end - begin));
    }
  }
  return saved.info();
}

std::vector<safetensors::TensorSpec> SavedCheckpoint::weight_specs() const {
  return expected_files(metadata_->json, CheckpointFormat::kFull).at(0).second;
}

void SavedCheckpoint::stream_weights(const std::function<void(const torch::Tensor&)>& take) const {
  const nlohmann::json& units = metadata_->json.at("units");
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t numel = units[u].at("numel").get<int64_t>();
    torch::Tensor full = torch::empty({numel}, torch::kFloat);
    read_range(u, "param", 0, numel, full);
    for (const auto& p : units[u].at("params")) {
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      take(full.narrow(0, p.at("offset").get<int64_t>(), numel_of(shape)).view(shape));
    }
  }
}

void convert_to_full(const std::string& checkpoint, const std::string& output) {
  SavedCheckpoint saved(checkpoint);
  safetensors::Writer writer(output, saved.weight_specs(), {{"format", "pt"}, {"converted_from", checkpoint}});
  saved.stream_weights([&](const torch::Tensor& weight) { writer.write(weight); });
  writer.commit();
}

}  // namespace fsdp
