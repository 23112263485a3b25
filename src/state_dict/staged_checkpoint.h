#pragma once
// Asynchronous checkpoints (CheckpointManagerOptions::async): a save in three
// parts, so that training goes on while the files are written.
//  1. staging, on the calling thread: every collective the save needs (the
//     folder prepared by rank 0, the full format's gathers to rank 0) and a
//     copy of this rank's part in host memory (its shards and optimizer
//     state; an offloaded unit brought in by its ResidentScope and copied out);
//  2. the write, on a thread of this rank: file I/O and checksums only, no
//     collective (MPI grants MPI_THREAD_MULTIPLE, but a collective there would
//     have to be ordered against the training thread's on every rank);
//  3. publishing, on the calling thread again, collective: once every rank's
//     write finished, rank 0 records the checksums, writes metadata.json and
//     renames DIR/step-N.tmp to DIR/step-N, as a synchronous save does, so the
//     files are the same bytes. Until then the previous checkpoint is the
//     newest complete one: a rank killed mid-write leaves it loadable.

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"

namespace fsdp::detail {

class StagedCheckpoint {
 public:
  // Collective over state.group(): stages `step`'s checkpoint of `state` and
  // `optimizer` under `dir` (as save_checkpoint would write it) and starts
  // this rank's write. `reuse`: the host buffers of the save before
  // (take_buffers), copied into where they fit (the sharded format).
  StagedCheckpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& dir, int64_t step,
                   const CheckpointExtra& extra, CheckpointFormat format, std::vector<torch::Tensor> reuse = {});
  // Joins the write (never collective; an unpublished save stays step-N.tmp).
  ~StagedCheckpoint();
  StagedCheckpoint(const StagedCheckpoint&) = delete;
  StagedCheckpoint& operator=(const StagedCheckpoint&) = delete;

  // DIR/step-N, where publish() puts it.
  const std::string& path() const { return final_dir_; }
  // Bytes of this rank's staging copy.
  int64_t staged_bytes() const { return staged_bytes_; }
  // Collective over `group`: whether every rank's write has finished.
  bool written_everywhere(const ProcessGroupPtr& group) const;
  // Collective over `group`: waits for this rank's write, then, if every
  // rank's succeeded, rank 0 publishes; throws the first failing rank's error
  // (naming the checkpoint, the rank and the cause) on every rank. Returns the
  // slowest rank's write, in seconds.
  double publish(const ProcessGroupPtr& group);
  // After publish(): the staging buffers, for the next save to copy into.
  std::vector<torch::Tensor> take_buffers() { return std::move(buffers_); }

  // One file this rank writes: its tensors in the file's order.
  struct File {
    std::string path;
    std::vector<safetensors::TensorSpec> specs;
    std::map<std::string, std::string> metadata;
    std::vector<torch::Tensor> tensors;
  };

 private:
  void write_files();  // the thread's body

  int rank_ = 0;
  std::string dir_, temp_dir_, final_dir_;
  CheckpointFormat format_ = CheckpointFormat::kSharded;
  std::string metadata_json_;  // metadata.json without "files" (nlohmann's text: no JSON type in this header)
  std::vector<File> files_;
  std::vector<torch::Tensor> buffers_;  // the sharded format's staging copies (files_ holds them too)
  int64_t staged_bytes_ = 0;
  std::atomic<bool> written_{false};
  double write_seconds_ = 0.0;
  std::string error_;  // the write's failure (read after joining)
  std::thread writer_;
};

}  // namespace fsdp::detail
