// Checkpoints, what they hold: the files and tensors of either format, the
// layout metadata.json records and every check of it (read_metadata,
// check_layout), its checksum, writing it (write_checkpoint_metadata), and its
// conversion to and from the API's CheckpointInfo and CheckpointExtra. Also the
// helpers saving and loading share (checkpoint_schema.h declares them).

#include "state_dict/checkpoint_schema.h"
#include "core/nf4.h"
#include "base/checksum.h"
#include "core/fsdp_state_impl.h"
#include "core/flat_param.h"
#include "state_dict/checkpoint_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "fsdp/state_dict.h"
#include "state_dict/safetensors_metadata.h"

namespace fsdp {
namespace fs = std::filesystem;
namespace {

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
              meta["files"].size(), " files, the ", fsdp::enum_name(format), " format with shard_group_size ",
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
    require_field(!unit.contains("frozen") || unit["frozen"].is_boolean(), unit_field + ".frozen", "a boolean", file);
    require_field(!unit.contains("nf4") || unit["nf4"].is_boolean(), unit_field + ".nf4", "a boolean", file);
    // NF4 weights (frozen_nf4) each begin on a block of 64 elements.
    const int64_t align = unit.value("nf4", false) ? nf4::kBlock : 1;
    auto aligned = [align](int64_t n) { return (n + align - 1) / align * align; };
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
      TORCH_CHECK(offset == aligned(packed), "'", file, "': ", field, " starts at offset ", offset, ", expected ",
                  aligned(packed), " (parameters lie back to back in their unit's flat buffer)");
      packed = offset + elements;
    }
    packed = aligned(packed);
    TORCH_CHECK(packed == numel, "'", file, "': the parameters of ", unit_field, " hold ", packed,
                " elements, its numel says ", numel);
    if (format == CheckpointFormat::kSharded) {
      const int64_t blocks = numel / align, expected = (blocks / shard_group_size + (blocks % shard_group_size != 0)) * align;
      TORCH_CHECK(shard_numel == expected, "'", file, "': ", unit_field, ".shard_numel is ", shard_numel, ", but ",
                  numel, " elements in ", shard_group_size, " shards make shards of ", expected);
    }
  }
}

}  // namespace

namespace detail {

const char* format_tag(CheckpointFormat format) {
  return format == CheckpointFormat::kSharded ? "fsdp-sharded-v1" : "fsdp-full-v1";
}

std::string shard_file(int64_t shard_index) { return "shard-" + std::to_string(shard_index) + ".safetensors"; }
std::string tensor_name(size_t unit, const std::string& what) { return "u" + std::to_string(unit) + "." + what; }

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

nlohmann::json unit_layout(const FsdpState& state) {
  nlohmann::json units = nlohmann::json::array();
  for (FlatParam* buffer : detail::flat_params(state)) {
    const FlatParam& flat = *buffer;
    nlohmann::json params = nlohmann::json::array();
    for (const auto& e : flat.entries()) params.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
    units.push_back({{"name", flat.name()}, {"numel", flat.numel()}, {"shard_numel", flat.shard_numel()},
                     {"params", params}});
    if (flat.frozen()) units.back()["frozen"] = true;
    if (flat.nf4()) units.back()["nf4"] = true;
  }
  return units;
}

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

std::vector<std::string> unit_state_names(const nlohmann::json& meta, size_t unit) {
  if (meta.at("units").at(unit).value("frozen", false)) return {"param"};
  return state_names(meta);
}

FileSpecs expected_files(const nlohmann::json& meta, CheckpointFormat format) {
  const nlohmann::json& units = meta.at("units");
  FileSpecs files;
  if (format == CheckpointFormat::kSharded) {
    for (int64_t q = 0; q < meta.at("shard_group_size").get<int64_t>(); ++q) {
      std::vector<safetensors::TensorSpec> specs;
      for (size_t u = 0; u < units.size(); ++u) {
        const int64_t S = units[u].at("shard_numel").get<int64_t>();
        if (units[u].value("nf4", false)) {  // its records, as bytes
          specs.push_back({tensor_name(u, "param"), torch::kByte, {S / nf4::kBlock * nf4::kRecordBytes}});
          continue;
        }
        for (const auto& what : unit_state_names(meta, u)) specs.push_back({tensor_name(u, what), torch::kFloat, {S}});
      }
      files.emplace_back(shard_file(q), std::move(specs));
    }
    return files;
  }
  std::vector<safetensors::TensorSpec> params, moments;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::vector<std::string> names = unit_state_names(meta, u);
    for (const auto& p : units[u].at("params")) {
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

}  // namespace detail

using detail::fsync_path;

namespace detail {

const EnumNames& enum_names(EnumTag<CheckpointFormat>) {
  static const EnumNames names = EnumNames::of<CheckpointFormat>("checkpoint format", {
      {CheckpointFormat::kSharded, "sharded"},
      {CheckpointFormat::kFull, "full"}});
  return names;
}

}  // namespace detail

void write_checkpoint_metadata(const std::string& dir, nlohmann::json metadata) {
  metadata[kChecksumAlgorithmField] = fsdp::enum_name(checksum::kWritten);
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

}  // namespace fsdp
