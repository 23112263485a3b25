#pragma once
// fsdp-train's reporting: the banner, the progress line, the JSON log
// record, the summary JSON and the end-of-run printout. Rank 0 prints and
// writes; the figures come from the loop (RunFigures) and the planner
// (Predictions).

#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint_manager.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "plan/estimates.h"
#include "fsdp/train_step.h"
#include "train/options.h"
#include "train/setup.h"

namespace fsdp_train {

// The disk offload as the reports show it (nvme_report reads it from the
// model's state: the one place that knows the offload object).
struct NvmeReport {
  bool on = false;
  bool optimizer_state = false, params = false;  // what is offloaded
  std::string path, engine;                      // the scratch store's file and I/O engine
  int64_t offloaded_bytes = 0, file_bytes = 0;   // per rank
};
NvmeReport nvme_report(const fsdp::FsdpState& state);

// What the planner predicts for this run, and the construction's measure.
struct Predictions {
  int64_t num_params = 0;
  std::vector<int64_t> unit_numels;
  int shard_group_size = 1;
  fsdp::ModelStateBytes state;
  fsdp::StepPeak peak;
  std::optional<fsdp::NvmeOffloadPlan> nvme;
  int64_t peak_bytes = 0;         // the step's peak, with the disk offload where there is one
  int64_t construction_peak = 0;  // rank 0's tensor bytes after building and sharding
  int64_t tokens_per_step = 0;
  // The bytes a step moves per rank (by kind, across hosts and inside one),
  // for hosts of ranks_per_node ranks, with the run's ZeRO++ options.
  int ranks_per_node = 0;
  fsdp::CommBytes comm;
  // --ckpt-async: a save's staging copy on rank 0, held beside the steps
  // until its background write ends (0 without).
  int64_t checkpoint_staging = 0;
};
// The run's plan (fsdp::plan_run, as the preflight and fsdp-plan make it), for the report.
Predictions predict(const TrainOptions& o, const Run& run, const fsdp::FsdpState& state, int64_t num_params,
                    int world);

// The figures of the steps so far.
struct RunFigures {
  // Per step after the first (or the only one): medians for the summary.
  std::vector<double> step_times, exposed_comm_times, optimizer_times, offload_wait_times, offload_read, offload_written;
  std::vector<double> offload_copy_times, offload_checksum_times, offload_disk_times;  // the I/O thread's, by cause
  int offload_first_read_ahead = 0, offload_last_read_ahead = 0;  // the units the first and last steps read ahead
  fsdp::CommStats last_comm;
  fsdp::CommStats last_cross_host_comm;  // the part of last_comm over groups that span hosts
  fsdp::memory::Usage last_usage;        // this rank's tensor memory by category, right after the last step
  std::vector<fsdp::RankFigures> last_figures;  // rank 0 only: every rank's, of the last step
  std::vector<int64_t> max_peak;                // rank 0 only: every rank's peak tensor bytes over the steps
  double final_loss = 0.0;
  int64_t skipped_steps = 0;
  int64_t answer_tokens = 0;  // conversations: the answer tokens of the steps this run took (not skipped ones)
  std::optional<double> final_val_loss;
  std::optional<double> final_val_bpb;  // the same in bits per byte of text (train/text.h), when known
  int64_t eval_sequences = 0;
  int64_t first_step = 0;
  int64_t preempted_after = 0;  // the last step done when the ranks agreed to stop on a signal (0: none)
  bool signalled_here = false;  // this rank received the signal
  std::string resumed_from;     // the checkpoint --resume loaded
  fsdp::memory::DeviceUsage run_device_peak;
  double elapsed = 0.0;
  // Checkpoints of the run (rank 0's view): each save's time blocking
  // training, and with --ckpt-async what the background did.
  struct Checkpoints {
    std::vector<double> blocked_s;      // per save: writing (synchronous), or waiting + staging (async)
    double staging_s = 0.0;             // async: copying to the staging buffers, in all
    int64_t staged_bytes = 0;           // async: rank 0's staging copies, in all
    double waited_s = 0.0;              // async: waiting for the previous save's write, in all
    double background_write_s = 0.0;    // async: the published saves' writes (slowest rank), in all
    int64_t waited = 0;                 // async: saves that waited for the one before
    int64_t published = 0;              // saves complete on disk
    bool in_flight_this_step = false;   // async: a background write was in flight when this step began
    double blocked_this_step = 0.0;     // this step's save's blocked time (0: none)
  } checkpoints;
  void record_save(const fsdp::CheckpointSave& saved);
  void record_published(const fsdp::CheckpointSave& saved);
  // Takes step `step` (0-based) of `steps`; `cross_host`: the state's
  // cross_host_comm_stats() right after it (the part of result.comm that
  // crossed hosts).
  void record(const fsdp::StepResult& result, const fsdp::CommStats& cross_host, int64_t step, int64_t steps,
              int rank);
  // Folds the device's peak since the last call into run_device_peak.
  void fold_device_peak(c10::Device device);
};

// What every report reads.
struct ReportContext {
  const TrainOptions& o;
  Run& run;
  fsdp::FsdpState& state;
  const fsdp::TrainStep& train_step;
  const Predictions& predicted;
  const NvmeReport& nvme;
  int world_size;
};

// "LoRA r=8 alpha=16 on 32 linears (q_proj,v_proj)" ("" without LoRA): the banner's and the summary's.
std::string lora_description(const Run& run, const TrainOptions& o);

// Rank 0: the run's configuration, before the first step.
void print_banner(const ReportContext& c);
void print_resumed(const fsdp::CheckpointResume& resumed);
void print_saved(const fsdp::CheckpointSave& saved);
// Rank 0: a background save published (--ckpt-async).
void print_published(const fsdp::CheckpointSave& saved);
// Rank 0: step `step`'s (0-based) record in --log, and its progress line when due.
void report_step(const ReportContext& c, const RunFigures& figures, const fsdp::StepResult& result, int64_t step,
                 double lr, const std::optional<double>& val_loss);

// Collective: the figures every rank contributes to the end-of-run report.
struct EndFigures {
  int64_t peak_device = 0, peak_device_reserved = 0;  // the largest rank's
  std::vector<int64_t> rss;                           // every rank's peak resident set
  double save_final_s = 0.0;
  int64_t save_final_peak_extra = 0;
};
EndFigures gather_end_figures(const fsdp::ProcessGroupPtr& world, RunFigures& figures, c10::Device device);
// Rank 0: --summary's JSON object.
void write_summary(const ReportContext& c, const RunFigures& figures, const EndFigures& end);
// Rank 0: the end-of-run printout.
void print_summary(const ReportContext& c, const RunFigures& figures, const EndFigures& end);

}  // namespace fsdp_train
