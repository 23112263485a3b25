// Checkpoints, reading them back: finding them in a folder (latest, list,
// prune), opening one whole and checked (SavedCheckpoint: its files against
// the layout, their checksums, any unit's state read by range), loading one
// into a model and its optimizer (load_checkpoint), and converting one to a
// single safetensors file of full weights (convert_to_full).

#include "fsdp/checkpoint.h"
#include "core/fsdp_state_impl.h"
#include "core/flat_param.h"
#include "state_dict/checkpoint_json.h"
#include "state_dict/checkpoint_schema.h"
#include "core/nf4.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "fsdp/error.h"
#include "base/device_context.h"
#include "core/shard_offload.h"
#include "optim/optimizer_state.h"
#include "fsdp/state_dict.h"
#include "state_dict/safetensors_metadata.h"

namespace fsdp {
namespace fs = std::filesystem;
using detail::expected_files;
using detail::kModelFile;
using detail::kOptimizerFile;
using detail::read_metadata;
using detail::shard_file;
using detail::state_names;
using detail::unit_state_names;
using detail::tensor_name;
using detail::throw_first_rank_error;
using detail::unit_layout;

namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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

}  // namespace

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
  const std::vector<std::string> names = unit_state_names(meta, unit);
  TORCH_CHECK(std::find(names.begin(), names.end(), what) != names.end(), "read_range: checkpoint '", path_,
              "' holds no state '", what, "' of unit ", unit, " (it holds ", nlohmann::json(names).dump(), ")");
  const bool nf4_unit = units[unit].value("nf4", false);
  const int64_t out_numel = nf4_unit ? (to - from) / nf4::kBlock * nf4::kRecordBytes : to - from;
  TORCH_CHECK(0 <= from && from <= to && to <= units[unit].at("numel").get<int64_t>() && out.numel() == out_numel &&
                  (!nf4_unit || (from % nf4::kBlock == 0 && to % nf4::kBlock == 0 && out.scalar_type() == torch::kByte)),
              "read_range: [", from, ", ", to, ") does not fit unit ", unit, " or the output of ", out.numel(),
              nf4_unit ? " (an NF4 unit: whole blocks of 64, into uint8 records)" : "");
  if (nf4_unit) return read_nf4_range(unit, from, to, out);
  if (!in_host_memory(out) || out.scalar_type() != torch::kFloat) {
    // A GPU run's shard, or a frozen part held in another dtype
    // (frozen_param_dtype): read as saved, in float32 on the host, then copied over.
    torch::Tensor host = torch::empty(out.sizes(), out.options().device(torch::kCPU).dtype(torch::kFloat));
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

void SavedCheckpoint::read_nf4_range(size_t unit, int64_t from, int64_t to, const torch::Tensor& out) const {
  const nlohmann::json& meta = metadata_->json;
  const nlohmann::json& entry = meta.at("units").at(unit);
  torch::Tensor records = in_host_memory(out) ? out : torch::empty(out.sizes(), out.options().device(torch::kCPU));
  if (format_ == CheckpointFormat::kSharded) {  // the bytes, as saved
    const int64_t S = entry.at("shard_numel").get<int64_t>();
    for (int64_t q = 0; q < meta.at("shard_group_size").get<int64_t>(); ++q) {
      const int64_t lo = std::max(from, q * S), hi = std::min(to, (q + 1) * S);
      if (lo >= hi) continue;
      readers_.at(shard_file(q))->read_into(tensor_name(unit, "param"), (lo - q * S) / nf4::kBlock * nf4::kRecordBytes,
                                            records.narrow(0, (lo - from) / nf4::kBlock * nf4::kRecordBytes,
                                                           (hi - lo) / nf4::kBlock * nf4::kRecordBytes));
    }
  } else {  // dequantized values: quantized again, weight by weight, to the same bytes
    nf4::clear_records(records);
    for (const auto& p : entry.at("params")) {
      const int64_t offset = p.at("offset").get<int64_t>();
      const int64_t lo = std::max(from, offset), hi = std::min(to, offset + numel_of(p.at("shape").get<std::vector<int64_t>>()));
      if (lo >= hi) continue;
      torch::Tensor values = torch::empty({hi - lo}, torch::kFloat);
      readers_.at(kModelFile)->read_into(p.at("name").get<std::string>(), lo - offset, values);
      nf4::quantize_into_records(values, records.narrow(0, (lo - from) / nf4::kBlock * nf4::kRecordBytes,
                                                        nf4::blocks(hi - lo) * nf4::kRecordBytes));
    }
  }
  if (!records.is_same(out)) out.copy_(records);
}

CheckpointInfo load_checkpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& path) {
  settle_between_steps(state);
  OptimizerState optimizer_state(optimizer);
  SavedCheckpoint saved(path, SavedCheckpoint::Verify::kHeadersOnly);
  const nlohmann::json& meta = saved.metadata().json;
  // The model must be the one saved: same units, same parameters, same shapes.
  const nlohmann::json& saved_units = meta.at("units");
  const nlohmann::json our_units = unit_layout(state);
  TORCH_CHECK(saved_units.size() == our_units.size(), "checkpoint '", path, "' holds ", saved_units.size(),
              " units, this model has ", our_units.size(),
              " (another model configuration, wrap policy, or set of frozen parameters)");
  for (size_t u = 0; u < our_units.size(); ++u) {
    TORCH_CHECK(saved_units[u].at("params") == our_units[u].at("params"), "checkpoint '", path, "': unit '",
                our_units[u].at("name").get<std::string>(), "' was saved with other parameters or shapes ",
                "(another model configuration), or another set of frozen parameters: saved ",
                saved_units[u].at("params").dump(), ", model has ",
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
  for (size_t u = 0; u < detail::flat_params(state).size(); ++u) {
    FlatParam& flat = *detail::flat_params(state)[u];
    ResidentScope resident(state, flat, &optimizer);
    // This rank's new shard covers [begin, end) of the real elements; the
    // padding after them stays zero.
    const int64_t begin = std::min(flat.shard_rank() * flat.shard_numel(), flat.numel());
    const int64_t end = std::min(begin + flat.shard_numel(), flat.numel());
    if (flat.nf4()) {  // its records, read in whole blocks; the padding records stay zero
      const torch::Tensor records = flat.shard().detach();
      const int64_t bytes = (end - begin) / nf4::kBlock * nf4::kRecordBytes;
      nf4::clear_records(records.narrow(0, bytes, records.numel() - bytes));
      saved.read_range(u, "param", begin, end, records.narrow(0, 0, bytes));
      continue;
    }
    std::vector<torch::Tensor> targets = {flat.shard().detach()};
    if (flat.frozen()) {
      // Not among the optimizer's parameters: no state, saved or made.
    } else if (has_state) {
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
