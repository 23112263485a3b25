// Sharded checkpoints: writing each shard, and reading any layout back.

#include "fsdp/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "fsdp/compat.h"
#include "fsdp/error.h"
#include "fsdp/memory.h"
#include "fsdp/safetensors.h"

namespace fsdp {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "fsdp-sharded-v1";
const char* const kStateNames[] = {"param", "exp_avg", "exp_avg_sq"};

std::string hex(uint64_t v) {
  std::ostringstream s;
  s << std::hex << std::setw(16) << std::setfill('0') << v;
  return s.str();
}

std::string shard_file(int64_t shard_index) { return "shard-" + std::to_string(shard_index) + ".safetensors"; }
std::string tensor_name(size_t unit, const char* what) { return "u" + std::to_string(unit) + "." + what; }

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step-", 0) != 0) return -1;
  try {
    size_t used = 0;
    int64_t step = std::stoll(name.substr(5), &used);
    return used == name.size() - 5 ? step : -1;
  } catch (...) {
    return -1;
  }
}

torch::optim::AdamWParamState& adam_state(torch::optim::AdamW& optimizer, const torch::Tensor& shard) {
  auto key = compat::optimizer_state_key(optimizer, shard);
  auto& slot = optimizer.state()[key];
  if (!slot) {
    memory::MemoryCategoryScope scope(memory::Category::kOptimizerState);
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->exp_avg(torch::zeros_like(shard.detach()));
    fresh->exp_avg_sq(torch::zeros_like(shard.detach()));
    slot = std::move(fresh);
  }
  auto* state = dynamic_cast<torch::optim::AdamWParamState*>(slot.get());
  TORCH_CHECK(state, "sharded checkpoints hold AdamW state; the optimizer's state is of another kind");
  return *state;
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

}  // namespace

std::string save_sharded_checkpoint(FsdpState& state, torch::optim::AdamW& optimizer, const std::string& dir,
                                    int64_t step, const nlohmann::json& extra) {
  state.check_idle();
  const ProcessGroupPtr& group = state.group();
  const fs::path final_dir = fs::path(dir) / ("step-" + std::to_string(step));
  const fs::path temp_dir = fs::path(dir) / ("step-" + std::to_string(step) + ".tmp");
  std::string error;
  if (group->rank() == 0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(temp_dir);  // an unfinished earlier attempt
      fs::create_directories(temp_dir);
    } catch (const std::exception& e) {
      error = "cannot prepare checkpoint directory '" + temp_dir.string() + "': " + e.what();
    }
  }
  throw_if_any_rank_failed(group, error);

  // One writer per shard: the ranks of the first replica (all ranks unless
  // the strategy replicates shards across ranks or nodes).
  const bool writes = !state.replicate_group() || state.replicate_group()->rank() == 0;
  const int64_t shard_index = state.shard_group() ? state.shard_group()->rank() : 0;
  uint64_t checksum = 0;
  if (writes) {
    try {
      std::vector<safetensors::TensorSpec> specs;
      for (size_t u = 0; u < state.units().size(); ++u) {
        const int64_t S = state.units()[u]->flat_param().shard_numel();
        for (const char* what : kStateNames) specs.push_back({tensor_name(u, what), torch::kFloat, {S}});
      }
      safetensors::Writer writer((temp_dir / shard_file(shard_index)).string(), specs,
                                 {{"format", kFormat}, {"shard", std::to_string(shard_index)}});
      for (const auto& unit : state.units()) {
        const torch::Tensor& shard = unit->flat_param().shard();
        auto& adam = adam_state(optimizer, shard);
        writer.write(shard.detach());
        writer.write(adam.exp_avg());
        writer.write(adam.exp_avg_sq());
      }
      writer.commit();
      checksum = writer.checksum();
    } catch (const std::exception& e) {
      error = "rank " + std::to_string(group->rank()) + ": " + error_message(e);
    }
  }
  throw_if_any_rank_failed(group, error);

  // Rank 0 gathers the checksums, writes the metadata, and publishes.
  const int world = group->size();
  torch::Tensor mine = torch::tensor({writes ? shard_index : -1, static_cast<int64_t>(checksum)}, torch::kLong);
  torch::Tensor all = torch::empty({2 * world}, torch::kLong);
  group->all_gather(all, mine)->wait();
  if (group->rank() == 0) {
    try {
      int64_t adam_step = 0;
      if (!state.units().empty()) adam_step = adam_state(optimizer, state.units()[0]->flat_param().shard()).step();
      nlohmann::json files = nlohmann::json::object();
      for (int r = 0; r < world; ++r) {
        const int64_t index = all[2 * r].item<int64_t>();
        if (index >= 0) files[shard_file(index)] = hex(static_cast<uint64_t>(all[2 * r + 1].item<int64_t>()));
      }
      nlohmann::json meta = {{"format", kFormat},
                             {"step", step},
                             {"world_size", world},
                             {"strategy", strategy_name(state.options().strategy())},
                             {"shard_group_size", state.shard_group() ? state.shard_group()->size() : 1},
                             {"optimizer", {{"type", "adamw"}, {"step", adam_step}}},
                             {"files", files},
                             {"units", unit_layout(state)},
                             {"extra", extra}};
      const fs::path meta_temp = temp_dir / "metadata.json.tmp";
      {
        std::ofstream out(meta_temp);
        out << meta.dump(2) << "\n";
        out.flush();
        TORCH_CHECK(out.good(), "writing '", meta_temp.string(), "' failed");
      }
      fsync_path(meta_temp);
      fs::rename(meta_temp, temp_dir / "metadata.json");
      fsync_path(temp_dir);
      fs::remove_all(final_dir);  // a complete checkpoint of the same step is replaced
      fs::rename(temp_dir, final_dir);
      fsync_path(dir);
    } catch (const std::exception& e) {
      error = "publishing checkpoint '" + final_dir.string() + "' failed: " + error_message(e);
    }
  }
  throw_if_any_rank_failed(group, error);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return "";
  fs::path best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int64_t step = step_of(entry.path());
    if (step > best_step && fs::exists(entry.path() / "metadata.json")) {
      best_step = step;
      best = entry.path();
    }
  }
  return best.string();
}

void prune_checkpoints(const std::string& dir, int keep) {
  if (keep <= 0 || !fs::is_directory(dir)) return;
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int64_t step = step_of(entry.path());
    if (step >= 0 && fs::exists(entry.path() / "metadata.json")) complete.emplace_back(step, entry.path());
  }
  std::sort(complete.rbegin(), complete.rend());
  for (size_t i = static_cast<size_t>(keep); i < complete.size(); ++i) fs::remove_all(complete[i].second);
}

SavedCheckpoint::SavedCheckpoint(const std::string& path) : path_(path) {
  const fs::path dir(path);
  {
    std::ifstream in(dir / "metadata.json");
    TORCH_CHECK(in, "'", path, "' is not a complete checkpoint: it has no metadata.json");
    try {
      in >> metadata_;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "'", (dir / "metadata.json").string(), "' is not valid JSON: ", e.what());
    }
  }
  TORCH_CHECK(metadata_.value("format", "") == kFormat, "'", path, "' is not an fsdp sharded checkpoint (format '",
              metadata_.value("format", ""), "', expected '", kFormat, "')");
  // Every file the checkpoint lists must be there and intact.
  for (int64_t q = 0; q < shards(); ++q) {
    const std::string name = shard_file(q);
    TORCH_CHECK(metadata_.at("files").contains(name), "checkpoint '", path, "' lists no file for shard ", q);
    const fs::path file = dir / name;
    TORCH_CHECK(fs::exists(file), "checkpoint '", path, "' is missing '", name, "'");
    const std::string expected = metadata_.at("files").at(name).get<std::string>();
    const std::string found = hex(safetensors::file_checksum(file.string()));
    TORCH_CHECK(found == expected, "'", file.string(), "' is corrupt: checksum ", found, ", the metadata says ",
                expected);
    readers_.push_back(std::make_unique<safetensors::Reader>(file.string()));
  }
}

SavedCheckpoint::~SavedCheckpoint() = default;

int64_t SavedCheckpoint::shards() const { return metadata_.at("shard_group_size").get<int64_t>(); }

void SavedCheckpoint::read_range(size_t unit, const std::string& what, int64_t from, int64_t to,
                                 const torch::Tensor& out) const {
  const nlohmann::json& units = metadata_.at("units");
  TORCH_CHECK(unit < units.size(), "checkpoint '", path_, "' has ", units.size(), " units, asked for unit ", unit);
  const int64_t saved_shard = units[unit].at("shard_numel").get<int64_t>();
  TORCH_CHECK(0 <= from && from <= to && to <= units[unit].at("numel").get<int64_t>() && out.numel() == to - from,
              "read_range: [", from, ", ", to, ") does not fit unit ", unit, " or the output of ", out.numel());
  for (int64_t q = 0; q < shards(); ++q) {
    const int64_t lo = std::max(from, q * saved_shard), hi = std::min(to, (q + 1) * saved_shard);
    if (lo >= hi) continue;
    const std::string name = tensor_name(unit, what.c_str());
    torch::Tensor source = readers_[q]->read(name);
    TORCH_CHECK(source.numel() == saved_shard && source.scalar_type() == torch::kFloat, "'", readers_[q]->path(),
                "': tensor '", name, "' has ", source.numel(), " ", source.scalar_type(), " elements, the metadata says ",
                saved_shard, " float");
    out.narrow(0, lo - from, hi - lo).copy_(source.narrow(0, lo - q * saved_shard, hi - lo));
  }
}

nlohmann::json load_sharded_checkpoint(FsdpState& state, torch::optim::AdamW& optimizer, const std::string& path) {
  state.check_idle();
  SavedCheckpoint saved(path);
  const nlohmann::json& meta = saved.metadata();
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
  const int64_t adam_step = meta.at("optimizer").at("step").get<int64_t>();
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < state.units().size(); ++u) {
    FlatParam& flat = state.units()[u]->flat_param();
    // This rank's new shard covers [begin, end) of the real elements; the
    // padding after them stays zero.
    const int64_t begin = std::min(flat.shard_rank() * flat.shard_numel(), flat.numel());
    const int64_t end = std::min(begin + flat.shard_numel(), flat.numel());
    auto& adam = adam_state(optimizer, flat.shard());
    const torch::Tensor targets[] = {flat.shard().detach(), adam.exp_avg(), adam.exp_avg_sq()};
    for (int k = 0; k < 3; ++k) {
      targets[k].zero_();
      saved.read_range(u, kStateNames[k], begin, end, targets[k].narrow(0, 0, end - begin));
    }
    adam.step(adam_step);
  }
  return meta;
}

void convert_sharded_to_full(const std::string& checkpoint, const std::string& output) {
  SavedCheckpoint saved(checkpoint);
  const nlohmann::json& units = saved.metadata().at("units");
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& unit : units) {
    for (const auto& p : unit.at("params")) {
      specs.push_back({p.at("name").get<std::string>(), torch::kFloat, p.at("shape").get<std::vector<int64_t>>()});
    }
  }
  safetensors::Writer writer(output, specs, {{"format", "pt"}, {"converted_from", checkpoint}});
  for (size_t u = 0; u < units.size(); ++u) {  // one unit in memory at a time
    const int64_t numel = units[u].at("numel").get<int64_t>();
    torch::Tensor full = torch::empty({numel}, torch::kFloat);
    saved.read_range(u, "param", 0, numel, full);
    for (const auto& p : units[u].at("params")) {
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      writer.write(full.narrow(0, p.at("offset").get<int64_t>(), n).view(shape));
    }
  }
  writer.commit();
}

}  // namespace fsdp
