// Checkpoints, saving them: save_checkpoint (every rank's files written, then
// published whole by rank 0), and the asynchronous save's staging, background
// write and publishing (detail::StagedCheckpoint, staged_checkpoint.h).

#include "fsdp/checkpoint.h"
#include "core/fsdp_state_impl.h"
#include "core/flat_param.h"
#include "state_dict/checkpoint_json.h"
#include "state_dict/checkpoint_schema.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "fsdp/error.h"
#include "core/shard_offload.h"
#include "optim/optimizer_state.h"
#include "fsdp/state_dict.h"
#include "state_dict/save_faults.h"
#include "state_dict/staged_checkpoint.h"
#include "state_dict/safetensors_metadata.h"

namespace fsdp {
namespace fs = std::filesystem;
using detail::expected_files;
using detail::format_tag;
using detail::fsync_path;
using detail::kModelFile;
using detail::kOptimizerFile;
using detail::unit_layout;

namespace {

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
  for (size_t u = 0; u < detail::flat_params(state).size(); ++u) {
    const FlatParam& flat = *detail::flat_params(state)[u];
    ResidentScope resident(state, flat, &optimizer.optimizer());
    // A frozen part held in bf16 saved exactly, in fp32; NF4 weights as their bytes.
    writer.write(flat.nf4() ? flat.shard().detach().cpu() : flat.shard().detach().to(torch::kFloat));
    if (flat.frozen()) continue;  // no optimizer state (unit_state_names)
    for (const auto& name : optimizer.tensor_names()) writer.write(optimizer.value(flat.shard(), name));
    if (u == 0) detail::maybe_kill_for_test(state.group()->rank());
  }
  writer.commit();
}

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
  const torch::Tensor first_shard = detail::flat_params(state).front()->shard();
  nlohmann::json optimizer_meta = {{"type", optimizer_state.type()},
                                   {"step", optimizer_state.step(first_shard)},
                                   {"state", optimizer_state.tensor_names()},
                                   {"has_state", optimizer_state.has_state(first_shard)}};
  return {{"format", format_tag(format)},
          {"step", step},
          {"world_size", state.group()->size()},
          {"strategy", fsdp::enum_name(state.options().strategy())},
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
  settle_between_steps(state);  // the step counts and state the metadata reads
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
  for (size_t u = 0; u < detail::flat_params(state).size(); ++u) {
    const FlatParam& flat = *detail::flat_params(state)[u];
    ResidentScope resident(state, flat, &optimizer.optimizer());
    const torch::Tensor& shard = flat.shard();
    file.tensors.push_back(staging.copy(shard.to(torch::kFloat)));  // fp32 on disk, whatever the frozen dtype
    if (flat.frozen()) continue;  // no optimizer state (unit_state_names)
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
  optimizer_metadata["optimizer_step"] =
      std::to_string(optimizer.step(detail::flat_params(state).front()->shard()));
  StagedCheckpoint::File model{(temp_dir / kModelFile).string(), {}, metadata, {}};
  StagedCheckpoint::File moments{(temp_dir / kOptimizerFile).string(), {}, optimizer_metadata, {}};
  auto keep = [&](const FlatParam& flat, const torch::Tensor& local, StagedCheckpoint::File& file,
                  const char* state_name) {
    torch::Tensor full = flat.gather_full(local).to(torch::kFloat);  // (a frozen part held in bf16: exact)
    if (!writer) return;
    // no_shard's gather_full is the shard itself: copied, as is a device tensor.
    full = full.is_alias_of(local) || !full.is_cpu() ? staged_copy(full) : full;
    for (const auto& e : flat.entries()) {
      const std::string name = state_name ? optimizer_tensor_name(e.name, state_name) : e.name;
      file.specs.push_back({name, torch::kFloat, e.shape});
      file.tensors.push_back(full.narrow(0, e.offset, e.numel).view(e.shape));
    }
  };
  for (size_t u = 0; u < detail::flat_params(state).size(); ++u) {
    const FlatParam& flat = *detail::flat_params(state)[u];
    ResidentScope resident(state, flat, &optimizer.optimizer(), /*agree=*/true);
    keep(flat, flat.shard(), model, nullptr);  // the fp32 masters
    if (flat.frozen()) continue;               // no optimizer state (unit_state_names)
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
  settle_between_steps(state);  // the step counts and state the metadata reads
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

}  // namespace fsdp
