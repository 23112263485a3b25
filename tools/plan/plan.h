#pragma once
// fsdp-plan's shared parts: what it was asked (PlanInputs), the cluster
// (Cluster), the model planned, each strategy's figures and the --budget
// recommendation, gathered in one Report; and the functions its files share
// (main.cpp says which file owns what).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/estimates.h"
#include "fsdp/options.h"
#include "fsdp/run_plan.h"
#include "shared_flags.h"

namespace fsdp_plan {

// A cluster: the step-time model's description (fsdp::ClusterDescription:
// each device's FLOP/s, per-link bandwidth and latency inside a node and
// across nodes, the collectives measured), and what else calibrate measures.
struct Cluster : fsdp::ClusterDescription {
  // fsdp-plan calibrate --offload-dir: the host's disk, all its ranks at once (bytes/s; 0: not measured).
  double disk_read_bandwidth = 0, disk_write_bandwidth = 0;
  // fsdp-plan calibrate --preset: one forward and backward of that preset's model, all ranks at once.
  std::string model_step_preset;
  double model_step_s = 0;
  void load_measured(const nlohmann::json& j);  // calibrate's model_step and collectives
  static Cluster load(const std::string& path);  // a cluster description (calibrate.cpp)
};

// One strategy's figures, per rank: its run's plan (with --offload nvme its
// nvme, and the host's peak with it, step_peak), and what fsdp-plan adds.
struct Plan {
  fsdp::RunPlan run;
  int64_t host = 0;  // with --offload cpu: the model state, in host memory
  int64_t device() const { return run.peak.total() - host; }
  // ZeRO++: qwZ's packed buffers of a gather in flight (in run.peak.gathered).
  int64_t quantized_gather_buffers = 0;
  // --ckpt-async: a save's staging copy, beside the steps until written.
  std::optional<fsdp::CheckpointStaging> staging;
  // The host memory fsdp-train's preflight asks of a rank for this run (fsdp::host_memory_needed).
  int64_t preflight = 0;
};

// --budget: fsdp::choose_strategy's answer, or why nothing fits.
struct Recommendation {
  int64_t budget = 0;
  std::optional<fsdp::StrategyChoice> choice;
  std::vector<fsdp::StrategyCandidate> candidates;
  std::string reason;  // choice->reason, or the error naming every candidate's need
};

// What fsdp-plan was asked, as its command line gives it; the model's,
// ZeRO++'s and fine-tuning's flags are fsdp-train's (shared_flags.h).
struct PlanInputs : fsdp_tools::ModelFlags, fsdp_tools::ZeroPlusPlusFlags, fsdp_tools::RunFlags,
                    fsdp_tools::FineTuneFlags {
  double params = 0;
  int world = 2, nodes = 1;
  std::string strategy = "all", cluster_path, offload = "none";
  std::string ckpt_async = "none";  // fsdp-train --ckpt-async with this --ckpt-format
  bool prefetch = true, seed_accounting = false, json = false;
  bool trainable = false;  // --trainable: the model state by category, frozen apart, whatever the flags
  bool fine_tuning() const { return !freeze.empty() || lora(); }
  double budget = 0;
};

// The model planned: its description (the one fsdp-train plans with), and
// the shape and units' element counts of the wrap asked for, root first.
struct PlannedModel {
  fsdp::ModelDescription description;
  fsdp::TransformerShape shape;
  std::vector<int64_t> units;   // each unit's trainable elements
  std::vector<int64_t> frozen;  // each unit's frozen part's elements (empty: nothing frozen)
  std::vector<int64_t> nf4;     // of those, its NF4 weights' (used with --base-dtype nf4)
  int64_t total_params = 0, trainable_params = 0;
  int64_t largest_unit = 0;  // but the root, with its frozen part: the most one unit gathers
  fsdp_tools::FineTuned fine_tuned;  // --freeze or LoRA: what they did to the model
  // The model's configuration (ModelConfig::describe(): its family's switches too); "" for --params.
  std::string described;
  // What --init-from's config.json sets that the model ignores (printed as warnings).
  std::vector<std::string> ignored;
};

// Everything fsdp-plan prints, computed once for both its outputs.
struct Report {
  PlanInputs in;
  PlannedModel model;
  fsdp::MixedPrecision mp;
  int per_node = 1;
  std::vector<Plan> plans;
  std::optional<Recommendation> recommendation;
  std::optional<Cluster> cluster;
  double compute = 0;  // seconds of a step's compute on the cluster
  bool disk_measured = false;
  // The host's bandwidth, shared by its ranks, all of which swap at once.
  std::optional<double> io_seconds(const Plan& plan) const {
    if (!plan.run.nvme || !disk_measured) return std::nullopt;
    return plan.run.nvme->io_seconds(cluster->disk_read_bandwidth / per_node, cluster->disk_write_bandwidth / per_node);
  }
  fsdp::StepTime time_of(const Plan& plan) const { return fsdp::estimate_step_time(plan.run, *cluster, compute); }
};

// What `fsdp-plan calibrate` measures beyond FLOP/s and the gather bandwidth.
struct CalibrateOptions {
  std::string disk_dir;
  int64_t disk_bytes = 0;
  std::string preset;    // --preset: the model's step and the collectives at its largest unit
  int ranks_per_node = 0;  // --ranks-per-node: the hosts the collectives run over
  int reps = 3;
};

// `fsdp-plan calibrate`, under fsdp-run: rank 0 prints the cluster description (calibrate.cpp).
int calibrate(int* argc, char*** argv, const CalibrateOptions& options);

// fully_shard's options and the run's settings for strategy `s`, as
// fsdp-train sets them from the same flags (the run's plan: fsdp::plan_run).
fsdp::FullyShardOptions plan_options(const Report& r, fsdp::ShardingStrategy s, bool with_zero_plus_plus);
fsdp::RunSettings plan_settings(const Report& r);

// The report as one JSON object (--json), or as text tables (output.cpp).
void print_json(const Report& r);
void print_text(const Report& r);

}  // namespace fsdp_plan
