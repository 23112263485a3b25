// The checkpoint manager and the objects that save their own state.

#include "fsdp/checkpoint_manager.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/memory.h"
#include "state_dict/staged_checkpoint.h"
#include "state_dict/checkpoint_schema.h"

namespace fsdp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

nlohmann::json parse_saved(const std::string& text, const char* what, const std::string& checkpoint) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(!json.is_discarded(), "checkpoint ", checkpoint, ": its ", what, " is not JSON: ", text);
  return json;
}

}  // namespace

RecordedValue RecordedValue::text(const std::string& value) { return RecordedValue(nlohmann::json(value).dump()); }
RecordedValue RecordedValue::number(double value) { return RecordedValue(nlohmann::json(value).dump()); }

std::string LrScheduleState::state_json() const {
  const nlohmann::json json = {{"kind", fsdp::enum_name(schedule_.kind())},
                               {"lr", schedule_.lr()},
                               {"warmup_steps", schedule_.warmup_steps()},
                               {"min_lr", schedule_.min_lr()},
                               {"total_steps", schedule_.total_steps()}};
  return json.dump();
}

void LrScheduleState::load_state_json(const std::optional<std::string>& saved_text, const std::string& checkpoint) {
  if (!saved_text) return;
  const nlohmann::json j = parse_saved(*saved_text, "learning-rate schedule", checkpoint);
  const auto saved = LrSchedule()
                         .kind(fsdp::parse_enum<fsdp::LrScheduleKind>(j.at("kind").get<std::string>()))
                         .lr(j.at("lr").get<double>())
                         .warmup_steps(j.at("warmup_steps").get<int64_t>())
                         .min_lr(j.at("min_lr").get<double>())
                         .total_steps(j.at("total_steps").get<int64_t>());
  TORCH_CHECK(saved.same_as(schedule_), "resume: the checkpoint ", checkpoint,
              " was trained with the learning-rate schedule '", saved.describe(), "', this run asks for '",
              schedule_.describe(), "'", remedy_);
}

std::string DataOrderState::state_json() const {
  const nlohmann::json json = {{"order", fsdp::enum_name(options_.order())},
                               {"seed", options_.seed()},
                               {"val_fraction", options_.val_fraction()}};
  return json.dump();
}

void DataOrderState::load_state_json(const std::optional<std::string>& saved_text, const std::string& checkpoint) {
  if (!saved_text) return;
  const nlohmann::json saved = parse_saved(*saved_text, "data order", checkpoint);
  const nlohmann::json mine = nlohmann::json::parse(state_json());
  TORCH_CHECK(saved == mine, "resume: ", checkpoint, " was trained with data order ", saved.dump(),
              " but this run asks for ", mine.dump(), remedy_);
}

std::string LossScaleState::state_json() const { return nlohmann::json(scaler_.scale_factor()).dump(); }

void LossScaleState::load_state_json(const std::optional<std::string>& saved_text, const std::string& checkpoint) {
  if (!saved_text) return;
  const nlohmann::json saved = parse_saved(*saved_text, "loss scale", checkpoint);
  TORCH_CHECK(saved.is_number() && saved.get<double>() > 0, "checkpoint ", checkpoint,
              ": the loss scale must be a positive number, found ", saved.dump());
  scaler_.set_scale_factor(saved.get<double>());
}

CheckpointManager::CheckpointManager(FsdpState& state, torch::optim::Optimizer& optimizer,
                                     CheckpointManagerOptions options)
    : state_(state), optimizer_(optimizer), options_(std::move(options)) {
  TORCH_CHECK(!options_.dir().empty(), "CheckpointManager needs a folder, got an empty path");
  TORCH_CHECK(options_.every() >= 0 && options_.keep() >= 1, "CheckpointManager: every must be >= 0 and keep >= 1, got ",
              options_.every(), " and ", options_.keep());
}

void CheckpointManager::add(const std::string& key, Stateful& object) {
  for (const auto& [k, o] : objects_) TORCH_CHECK(k != key, "CheckpointManager: '", key, "' was added twice");
  objects_.emplace_back(key, &object);
}

bool CheckpointManager::due(int64_t completed_steps, int64_t total_steps) const {
  return (options_.every() > 0 && completed_steps % options_.every() == 0) || completed_steps == total_steps;
}

CheckpointManager::~CheckpointManager() = default;  // pending_'s destructor joins its write

CheckpointSave CheckpointManager::save(int64_t completed_steps) {
  CheckpointExtra extra;
  for (const auto& [key, object] : objects_) extra[key] = object->state_json();
  if (options_.async()) return stage(completed_steps, extra);
  const auto start = Clock::now();
  memory::reset_peaks();
  const int64_t live_before = memory::usage().live_total;
  CheckpointSave result;
  result.path = save_checkpoint(state_, optimizer_, options_.dir(), completed_steps, extra, options_.format());
  result.peak_extra_bytes = memory::usage().peak_total - live_before;
  result.seconds = seconds_since(start);
  result.published = true;
  if (state_.group()->rank() == 0) prune_checkpoints(options_.dir(), options_.keep());
  barrier_group()->barrier()->wait();
  return result;
}

// Async: the save before, if still in flight, is waited for and published
// first (at most one in flight); then this one is staged and its write started.
CheckpointSave CheckpointManager::stage(int64_t completed_steps, const CheckpointExtra& extra) {
  const auto start = Clock::now();
  CheckpointSave result;
  result.background = true;
  if (pending_) {
    const CheckpointSave previous = publish_pending();
    result.previous_path = previous.path;
    result.previous_write_seconds = previous.write_seconds;
    ++saves_waited_;
    result.waited_seconds = seconds_since(start);
  }
  const auto staging = Clock::now();
  memory::reset_peaks();
  const int64_t live_before = memory::usage().live_total;
  pending_ = std::make_unique<detail::StagedCheckpoint>(state_, optimizer_, options_.dir(), completed_steps, extra,
                                                        options_.format(), std::move(staging_buffers_));
  result.path = pending_->path();
  result.staged_bytes = pending_->staged_bytes();
  result.peak_extra_bytes = memory::usage().peak_total - live_before;
  result.staging_seconds = seconds_since(staging);
  result.seconds = seconds_since(start);
  pending_result_ = result;
  return result;
}

std::optional<CheckpointSave> CheckpointManager::poll() {
  if (!pending_ || !pending_->written_everywhere(barrier_group())) return std::nullopt;
  return publish_pending();
}

std::optional<CheckpointSave> CheckpointManager::wait() {
  if (!pending_) return std::nullopt;
  return publish_pending();
}

// Collective: publishes the save in flight (its error thrown on every rank,
// the save then dropped: its folder stays step-N.tmp, pruned later), then
// keeps the newest `keep`.
CheckpointSave CheckpointManager::publish_pending() {
  std::unique_ptr<detail::StagedCheckpoint> pending = std::move(pending_);
  CheckpointSave result = pending_result_;
  result.write_seconds = pending->publish(barrier_group());
  staging_buffers_ = pending->take_buffers();
  result.published = true;
  if (barrier_group()->rank() == 0) prune_checkpoints(options_.dir(), options_.keep());
  barrier_group()->barrier()->wait();
  return result;
}

std::optional<CheckpointResume> CheckpointManager::resume() {
  wait();  // a save in flight published first: it may be the newest
  const std::string latest = latest_checkpoint(options_.dir());
  if (latest.empty()) return std::nullopt;
  const auto start = Clock::now();
  CheckpointResume resumed;
  resumed.info = load_checkpoint(state_, optimizer_, latest);
  barrier_group()->barrier()->wait();
  resumed.seconds = seconds_since(start);
  for (const auto& [key, object] : objects_) {
    const auto saved = resumed.info.extra.find(key);
    object->load_state_json(saved == resumed.info.extra.end() ? std::nullopt : std::optional<std::string>(saved->second),
                            latest);
  }
  return resumed;
}

void check_folder_shared(const std::string& dir, const ProcessGroupPtr& world) {
  const std::filesystem::path probe = std::filesystem::path(dir) / ".fsdp-shared-probe";
  // Rank 0's token (its pid and clock), which every rank then looks for in the file.
  torch::Tensor token = torch::tensor(
      {static_cast<int64_t>(::getpid()) ^ static_cast<int64_t>(Clock::now().time_since_epoch().count())}, torch::kLong);
  world->broadcast(token, 0)->wait();
  const std::string expected = std::to_string(token.item<int64_t>());
  std::string error;
  if (world->rank() == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::ofstream(probe) << expected;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  world->barrier()->wait();
  std::string seen;
  std::ifstream(probe) >> seen;
  torch::Tensor blind = torch::zeros({world->size()}, torch::kInt);
  blind[world->rank()] = seen == expected ? 0 : 1;
  world->all_reduce(blind, ReduceOp::kSum)->wait();
  world->barrier()->wait();
  if (world->rank() == 0) std::filesystem::remove(probe);
  TORCH_CHECK(error.empty(), "checkpoint folder: cannot write in '", dir, "': ", error);
  std::ostringstream ranks;
  int count = 0;
  for (int r = 0; r < world->size(); ++r) {
    if (blind[r].item<int>()) ranks << (count++ ? ", " : "") << r;
  }
  TORCH_CHECK(count == 0, "checkpoint folder '", dir, "' is not shared: rank(s) ", ranks.str(), " cannot see the file rank 0 ",
              "wrote there, so a checkpoint would be split across machines and could not be loaded. Put it on a file ",
              "system every host mounts (NFS, Lustre, ...)");
}

CheckpointFolderLock::CheckpointFolderLock(const std::string& dir)
    : path_((std::filesystem::path(dir) / ".fsdp-lock").string()) {
  std::filesystem::create_directories(dir);
  // Locked, then checked to be still the file at the path: a holder that
  // removed it on its way out leaves a lock on a file no one else opens.
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TORCH_CHECK(fd_ >= 0, "checkpoint folder '", dir, "': cannot open its lock file '", path_, "': ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      std::string holder;
      char buffer[512] = {};
      if (::pread(fd_, buffer, sizeof(buffer) - 1, 0) > 0) holder = buffer;
      ::close(fd_);
      fd_ = -1;
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      TORCH_CHECK(error != EWOULDBLOCK, "checkpoint folder '", dir, "' is in use by another job (",
                  holder.empty() ? std::string("its lock file '") + path_ + "' names no holder" : holder,
                  "): one job at a time saves into a checkpoint folder; give this one another --ckpt-dir, or wait "
                  "for that job to end");
      TORCH_CHECK(false, "checkpoint folder '", dir, "': cannot lock '", path_, "': ", std::strerror(error));
    }
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      break;
    }
    ::close(fd_);
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string holder = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const int error = errno;
    ::close(fd_);
    TORCH_CHECK(false, "checkpoint folder '", dir, "': cannot write its lock file '", path_, "': ", std::strerror(error));
  }
}

CheckpointFolderLock::~CheckpointFolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: no one can have locked this file in between
  ::close(fd_);
}

}  // namespace fsdp
