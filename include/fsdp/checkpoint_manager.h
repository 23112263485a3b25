#pragma once
/// \file
/// CheckpointManager: interval, keep-N, resume over stateful objects.
///
/// The checkpoint manager: when to save (every K steps and after the last),
/// how many to keep (the newest N complete ones), and resuming from the
/// newest complete one, over a model, its optimizer and a set of objects
/// that save and load their own state (torchtitan's checkpointer). The
/// objects' states go into metadata.json's "extra", each under its key; on
/// resume each object checks what was saved against itself and refuses a
/// mismatch, naming both.
///
/// \code{.cpp}
/// fsdp::CheckpointManager checkpoints(model.state(), optimizer,
///                                     fsdp::CheckpointManagerOptions("ckpt").every(100));
/// fsdp::LrScheduleState schedule_state(schedule);
/// checkpoints.add("lr_schedule", schedule_state);
/// fsdp::check_folder_shared("ckpt", world);
/// if (auto resumed = checkpoints.resume()) first_step = resumed->info.step;
/// ... after each step: if (checkpoints.due(step + 1, steps)) checkpoints.save(step + 1);
/// \endcode
///
/// With CheckpointManagerOptions::async(true) a save copies the state to
/// host memory and returns; a thread writes and checksums the files while
/// training goes on. Call poll() at every step boundary (it publishes the
/// save once every rank's write is done) and wait() before the program ends.

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/lr_schedule.h"
#include "fsdp/token_data.h"

namespace fsdp {

/// An object that saves and loads its own part of a checkpoint, as JSON text.
class Stateful {
 public:
  virtual ~Stateful() = default;
  /// The state to save, as JSON text.
  virtual std::string state_json() const = 0;
  /// Takes the saved state (nullopt: the checkpoint holds none under this
  /// object's key, as one written before it was recorded). Throws, naming
  /// the saved and the current value, when the saved state cannot continue
  /// this run; `checkpoint` is the checkpoint's path, for the message.
  virtual void load_state_json(const std::optional<std::string>& saved, const std::string& checkpoint) = 0;
};

/// A value kept for the record (a configuration's description, a setting):
/// saved, and not checked on resume.
class RecordedValue : public Stateful {
 public:
  /// The value as JSON text.
  explicit RecordedValue(std::string json_text) : json_(std::move(json_text)) {}
  /// A string, recorded as a JSON string.
  static RecordedValue text(const std::string& value);
  /// A number, recorded as a JSON number.
  static RecordedValue number(double value);
  /// The value.
  std::string state_json() const override { return json_; }
  /// Accepts any saved value: a record, not a requirement.
  void load_state_json(const std::optional<std::string>&, const std::string&) override {}

 private:
  std::string json_;
};

/// The learning-rate schedule: a resume must continue the same one (a
/// cosine's length is part of it). A checkpoint without one is taken as it is.
class LrScheduleState : public Stateful {
 public:
  /// `remedy` ends the refusal's message (e.g. which options to pass).
  explicit LrScheduleState(const LrSchedule& schedule, std::string remedy = "")
      : schedule_(schedule), remedy_(std::move(remedy)) {}
  /// {"kind", "lr", "warmup_steps", "min_lr", "total_steps"}.
  std::string state_json() const override;
  /// Refuses a schedule that gives some step another learning rate (LrSchedule::same_as).
  void load_state_json(const std::optional<std::string>& saved, const std::string& checkpoint) override;

 private:
  const LrSchedule& schedule_;
  std::string remedy_;
};

/// The data order (order, seed, validation fraction): a resume in another
/// would silently continue with other batches. A checkpoint without one is
/// taken as it is.
class DataOrderState : public Stateful {
 public:
  /// `remedy` ends the refusal's message (e.g. which options to pass).
  explicit DataOrderState(const models::TokenDataOptions& options, std::string remedy = "")
      : options_(options), remedy_(std::move(remedy)) {}
  /// {"order", "seed", "val_fraction"}.
  std::string state_json() const override;
  /// Refuses any other order, seed or validation fraction.
  void load_state_json(const std::optional<std::string>& saved, const std::string& checkpoint) override;

 private:
  models::TokenDataOptions options_;
  std::string remedy_;
};

/// The loss scaler's scale factor: saved, and restored on resume (a
/// checkpoint without one leaves the scaler's own).
class LossScaleState : public Stateful {
 public:
  /// Over the step's scaler (it must outlive this object).
  explicit LossScaleState(GradScaler& scaler) : scaler_(scaler) {}
  /// The scale factor, a number.
  std::string state_json() const override;
  /// Sets the saved scale factor (refusing one that is not a positive number).
  void load_state_json(const std::optional<std::string>& saved, const std::string& checkpoint) override;

 private:
  GradScaler& scaler_;
};

/// Where and how often the manager saves.
struct CheckpointManagerOptions {
  /// `dir`: the folder of the step-N checkpoints.
  explicit CheckpointManagerOptions(std::string dir) : dir_(std::move(dir)) {}
  /// The folder of the step-N checkpoints.
  TORCH_ARG(std::string, dir);
  /// Save every K steps (0: only after the last step).
  TORCH_ARG(int64_t, every) = 0;
  /// Keep the newest N complete checkpoints (at least 1).
  TORCH_ARG(int, keep) = 2;
  /// The layout of the tensors.
  TORCH_ARG(CheckpointFormat, format) = CheckpointFormat::kSharded;
  /// The group whose barrier ends a save and a resume (null: the model's
  /// group). A GPU run sharded over NCCL passes its MPI world, so that the
  /// wait stays on the host instead of queueing a device collective.
  TORCH_ARG(ProcessGroupPtr, barrier_group) = nullptr;
  /// Save in the background: save() copies this rank's shards and optimizer
  /// state to host memory (the full format: rank 0 gathers the whole model
  /// there, the other ranks keep nothing), returns, and a thread of this rank
  /// writes and checksums the files while training goes on. Collectives stay
  /// on the calling thread: the checkpoint is published (renamed complete,
  /// older ones pruned) by the first poll(), save() or wait() after every
  /// rank's write finished. At most one save is in flight: the next save()
  /// waits for the one before. Staging memory: the planner's RunPlan::staging.
  TORCH_ARG(bool, async) = false;
};

/// One save: where it went, and what it cost.
struct CheckpointSave {
  std::string path;            ///< DIR/step-N
  /// The time training was blocked: writing and publishing, or in the
  /// background (async) waiting for the save before and staging.
  double seconds = 0.0;
  int64_t peak_extra_bytes = 0;  ///< this rank's tensor memory peak above its live bytes while saving
  bool background = false;       ///< written by a background thread (CheckpointManagerOptions::async)
  bool published = false;        ///< complete on disk (at once for a synchronous save; async: by poll or wait)
  double waited_seconds = 0.0;   ///< async, of `seconds`: waiting for the previous save's background write
  double staging_seconds = 0.0;  ///< async, of `seconds`: copying the state to the staging buffers
  int64_t staged_bytes = 0;      ///< async: this rank's staging copy
  double write_seconds = 0.0;    ///< async, once published: the slowest rank's background write
  /// Async: the save this one waited for and published first (its path;
  /// empty when none was in flight), and its background write's seconds.
  std::string previous_path;
  double previous_write_seconds = 0.0;  ///< see previous_path
};

namespace detail {
/// A staged checkpoint and its background write (the library's own, not installed).
class StagedCheckpoint;
}  // namespace detail

/// One resume: what was loaded, and how long it took.
struct CheckpointResume {
  CheckpointInfo info;   ///< the checkpoint's step, world size, strategy, extra
  double seconds = 0.0;  ///< loading (every rank done)
};

/// Saves, prunes and resumes the checkpoints of one run. Every method is
/// collective over the model's ranks.
class CheckpointManager {
 public:
  /// Over a sharded model's state and the optimizer of its shards (both must
  /// outlive the manager).
  CheckpointManager(FsdpState& state, torch::optim::Optimizer& optimizer, CheckpointManagerOptions options);
  /// Waits for a background write still in flight (not collective: a save
  /// that poll() or wait() did not publish stays DIR/step-N.tmp, and the
  /// previous checkpoint remains the newest complete one).
  ~CheckpointManager();
  /// Adds an object whose state is saved under `key` of the metadata's
  /// extra; it must outlive the manager. Keys are checked in the order added.
  void add(const std::string& key, Stateful& object);
  /// Whether a checkpoint is due after `completed_steps` of `total_steps`:
  /// every `every` steps, and after the last.
  bool due(int64_t completed_steps, int64_t total_steps) const;
  /// Saves `DIR/step-<completed_steps>` with every object's state, then keeps
  /// the newest `keep` complete checkpoints. Async: first waits for a save
  /// still in flight (publishing it), then stages this one and returns.
  CheckpointSave save(int64_t completed_steps);
  /// At a step boundary, collective: with a background save in flight, one
  /// small all-reduce asks whether every rank's write finished; if so the
  /// save is published and returned. Nothing collective without one in
  /// flight. Throws a failed background write's error, naming the
  /// checkpoint, the rank and the cause.
  std::optional<CheckpointSave> poll();
  /// Collective: waits for the background save in flight (if any) on every
  /// rank and publishes it; nullopt when none was in flight. Throws as poll().
  std::optional<CheckpointSave> wait();
  /// Whether a background save is in flight (the same on every rank).
  bool in_flight() const { return pending_ != nullptr; }
  /// Saves that had to wait for the previous one's background write.
  int64_t saves_waited() const { return saves_waited_; }
  /// Loads the newest complete checkpoint into the model and optimizer, then
  /// hands each object its saved state (each may refuse it); nullopt when the
  /// folder holds none.
  std::optional<CheckpointResume> resume();
  /// Where and how often it saves.
  const CheckpointManagerOptions& options() const { return options_; }

 private:
  const ProcessGroupPtr& barrier_group() const {
    return options_.barrier_group() ? options_.barrier_group() : state_.group();
  }

  FsdpState& state_;
  torch::optim::Optimizer& optimizer_;
  CheckpointManagerOptions options_;
  std::vector<std::pair<std::string, Stateful*>> objects_;
  std::unique_ptr<detail::StagedCheckpoint> pending_;  // the background save in flight
  std::vector<torch::Tensor> staging_buffers_;  // the last save's host copies, reused by the next
  CheckpointSave pending_result_;
  int64_t saves_waited_ = 0;
  CheckpointSave stage(int64_t completed_steps, const CheckpointExtra& extra);
  CheckpointSave publish_pending();
};

/// One job at a time in a checkpoint folder: two jobs saving into one folder
/// would rotate away each other's checkpoints and resume from a mix. Held
/// by one process (a job's rank 0) from construction to destruction, as an
/// advisory lock (flock) on `DIR/.fsdp-lock`, which names the holder's host
/// and pid. A second holder is refused naming the first; the kernel drops the
/// lock when its holder ends, however it ends, so a folder whose job died is
/// taken over without a stale lock to clear. Creates `dir` if need be.
class CheckpointFolderLock {
 public:
  /// Takes the lock of `dir` (made if need be); throws naming the holder
  /// where another process holds it.
  explicit CheckpointFolderLock(const std::string& dir);
  /// Removes the lock file and drops the lock.
  ~CheckpointFolderLock();
  CheckpointFolderLock(const CheckpointFolderLock&) = delete;
  CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;
  /// The lock file.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

/// Collective over `world`: every rank must see the files the others write in
/// `dir`, or a checkpoint would be split across machines: rank 0 writes a
/// probe there, every rank reads it back. Throws naming the ranks that cannot.
void check_folder_shared(const std::string& dir, const ProcessGroupPtr& world);

}  // namespace fsdp
