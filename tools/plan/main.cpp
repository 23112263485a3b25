// fsdp-plan: the memory planner. Per-rank memory and communication of every
// strategy for a model, a world and a precision, a strategy recommendation
// for a budget, and (with a cluster description) step time and scaling
// efficiency. Its model-state figures are the ones a run measures, to the
// byte; its peaks are within a few percent for the reference GPT. --budget
// applies fsdp::choose_strategy, fsdp-train --strategy auto's rule; --json
// prints all of it as one JSON object for scripts.
//   fsdp-plan --preset medium --world 2
//   fsdp-plan --params 70e9 --layers 80 --width 8192 --world 8 --param-dtype bf16
//   fsdp-plan --preset large --world 16 --nodes 2 --cluster cluster.json
//   fsdp-plan --preset tiny --world 4 --budget 800000 --json
//   fsdp-plan --model llama --init-from Qwen2.5-0.5B --world 4 --batch 1 --context 2048
//   build/fsdp-run -n 2 -- build/fsdp-plan calibrate > cluster.json
//
// The program's parts (plan/plan.h says what they share): this file (the
// command line, the planning: make_report, and main), calibrate.cpp
// (fsdp-plan calibrate's measurements), output.cpp (the JSON object and the
// text tables).

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/device_choice.h"
#include "fsdp/error.h"
#include "plan/host_memory.h"
#include "fsdp/hugging_face.h"
#include "plan/estimates.h"
#include "fsdp/run_plan.h"
#include "fsdp/train_step.h"
#include "plan/plan.h"
#include "shared_flags.h"
#include "tool_support.h"
#include "state_dict/hugging_face_files.h"
#include "models/attention_kernel.h"
#include "core/cpu_features.h"
#include "core/strategy_rules.h"
#include "core/loss_scaling.h"

namespace fsdp_plan {
namespace {

void add_plan_options(CLI::App& app, PlanInputs& in) {
  fsdp_tools::add_model_flags(app, in, " (the model fsdp-train --preset trains); or give --params or --init-from",
                              "a Hugging Face model (its folder, its model.safetensors or its config.json): plan the "
                              "model its config.json describes, every switch of its family counted, as fsdp-train "
                              "--init-from trains it (only config.json is read; the batch is --batch, else --preset's, "
                              "else fsdp-train's default preset's)");
  app.add_option("--params", in.params,
                 "or a reference GPT of this many parameters (with --layers; e.g. 70e9): --width defaults from the "
                 "count, --vocab to 32000, --context to 4096, --heads to width / 128, --batch to 1")
      ->check(fsdp_tools::positive());
  app.add_option("--world", in.world, "ranks")->check(fsdp_tools::positive())->capture_default_str();
  app.add_option("--nodes", in.nodes, "nodes (hybrid strategies shard inside a node)")
      ->check(fsdp_tools::positive())
      ->capture_default_str();
  app.add_option("--strategy", in.strategy, "one strategy, or all")->capture_default_str();
  fsdp_tools::add_run_flags(app, in);
  app.add_flag("!--no-prefetch", in.prefetch, "no unit gathered ahead (default: one)");
  app.add_option("--offload", in.offload,
                 "none; cpu: fp32 masters, gradients and optimizer state in host memory; nvme: the optimizer state "
                 "and (sharded strategies) the parameters on disk, as fsdp-train --offload-optimizer nvme "
                 "--offload-params nvme; nvme-optimizer: the optimizer state only")
      ->capture_default_str();
  app.add_option("--ckpt-async", in.ckpt_async,
                 "none; sharded or full: the host memory of fsdp-train --ckpt-async --ckpt-format FORMAT's staging copy "
                 "(held beside the steps while a save writes in the background)")
      ->capture_default_str();
  app.add_option("--budget", in.budget,
                 "per-rank bytes for model state plus gathered parameters: the strategy fsdp-train --strategy auto "
                 "--memory-budget picks (the first that fits, from least to most communication)")
      ->check(fsdp_tools::positive());
  fsdp_tools::add_zero_plus_plus_flags(app, in);
  fsdp_tools::add_fine_tune_flags(app, in);
  app.add_flag("--trainable", in.trainable,
               "print how many parameters train, and the model state per rank by category with the frozen "
               "parameters' apart (printed anyway with --freeze or --lora-rank)");
  app.add_option("--cluster", in.cluster_path, "cluster JSON (fsdp-plan calibrate writes one): estimate step time");
  app.add_flag("--seed-accounting", in.seed_accounting,
               "also print the textbook DDP-versus-FSDP table, with the optimizer state at 4 B per parameter "
               "(the common shortcut) and at Adam's real 12");
  app.add_flag("--json", in.json, "print the whole plan as one JSON object instead (fields: README.md)");
}

void check_inputs(const PlanInputs& in) {
  TORCH_CHECK(in.params == 0 ? !in.preset.empty() || !in.init_from.empty() : in.preset.empty() && in.init_from.empty(),
              "give --preset or --params (with --layers), not both; or --init-from a Hugging Face model");
  fsdp_tools::check_model_flags(in);
  TORCH_CHECK(in.kind() == fsdp::models::ModelKind::kGpt || in.params == 0, "--params plans the reference GPT's blocks; --model ", in.model,
              " needs --preset");
  TORCH_CHECK(!in.fine_tuning() || in.params == 0, "--freeze and --lora-rank plan the model fsdp-train builds, by its "
              "parameters' names: give --preset or --init-from, not --params (a count without names)");
  TORCH_CHECK(in.world > 0 && in.nodes > 0 && in.world % in.nodes == 0, "--world must be a positive multiple of --nodes");
  TORCH_CHECK(in.offload == "none" || in.offload == "cpu" || in.offload == "nvme" || in.offload == "nvme-optimizer",
              "--offload must be none, cpu, nvme or nvme-optimizer, got '", in.offload, "'");
  TORCH_CHECK(in.wrap == "block" || in.wrap == "sublayer", "--wrap must be block or sublayer, got '", in.wrap, "'");
  TORCH_CHECK(in.ckpt_async == "none" || in.ckpt_async == "sharded" || in.ckpt_async == "full",
              "--ckpt-async must be none, sharded or full, got '", in.ckpt_async, "'");
  TORCH_CHECK(in.budget >= 0, "--budget must be a positive number of bytes, got ", in.budget);
  // The budget is fsdp-train's: model state and gathered parameters on the device.
  TORCH_CHECK(in.budget == 0 || in.offload == "none", "--budget covers the model state on the device, as fsdp-train "
              "--memory-budget does; it cannot be combined with --offload ", in.offload);
}

// --params: a reference GPT of that many parameters, its blocks taking what
// the embeddings leave, its dimensions defaulted from the count.
fsdp::ModelDescription describe_by_count(const PlanInputs& in, bool sublayer) {
  TORCH_CHECK(in.layers, "--params needs --layers");
  fsdp::ModelDescription d;
  fsdp::TransformerShape& shape = d.shape;
  shape.layers = *in.layers;
  shape.vocab = in.vocab.value_or(32000);
  // 12 C^2 per block dominates: C from the parameter count unless given.
  shape.width = in.width.value_or(static_cast<int64_t>(std::sqrt(in.params / (12.0 * shape.layers))));
  shape.context = in.context.value_or(4096);
  shape.heads = in.heads.value_or(std::max<int64_t>(1, shape.width / 128));
  shape.batch = in.batch.value_or(1);
  fsdp::TransformerShape wrapped = shape;
  wrapped.sublayer_units = sublayer;
  std::vector<int64_t> units = wrapped.unit_numels();
  // Exactly the count asked for: the blocks take what the embeddings leave.
  const double block = (in.params - static_cast<double>(units[0])) / static_cast<double>(shape.layers);
  TORCH_CHECK(block > 0, "--params ", in.params, " is smaller than the embeddings alone");
  for (size_t u = 1; u < units.size(); ++u) {
    // Per sublayer: attention 4 C^2 and MLP 8 C^2 of a block's 12 C^2.
    const double share = !sublayer ? 1.0 : (u % 2 == 1 ? 1.0 / 3 : 2.0 / 3);
    units[u] = static_cast<int64_t>(block * share);
  }
  (sublayer ? d.sublayer_units : d.layer_units) = std::move(units);
  return d;
}

// The model of --preset and the shape's flags, or of --init-from's config.json
// (over fsdp-train's default preset where --preset is not given, as fsdp-train
// --init-from takes its batch from it). What config.json sets that the model
// ignores goes to `ignored`.
fsdp::models::ModelConfig configured_model(const PlanInputs& in, std::vector<std::string>& ignored) {
  fsdp_tools::ModelFlags flags = in;
  if (flags.preset.empty()) flags.preset = fsdp_tools::kTrainerPreset;
  const fsdp::models::ModelConfig ours = fsdp_tools::model_config(flags, fsdp_tools::gpt_config(flags));
  if (in.init_from.empty()) return ours;
  return fsdp_tools::init_from_config(in, fsdp::hugging_face::find_config(in.init_from), ours, ignored);
}

PlannedModel plan_model(const PlanInputs& in) {
  const bool sublayer = in.wrap == "sublayer";
  PlannedModel m;
  if (in.params > 0) {
    m.description = describe_by_count(in, sublayer);
  } else {
    const fsdp::models::ModelConfig config = configured_model(in, m.ignored);
    m.description = fsdp_tools::plan_description(in, config, &m.fine_tuned);
    m.described = config.describe();
  }
  // (--params' shape too: the kernel is the run's, not the model's.)
  m.description.shape.attention_saves_probabilities =
      fsdp::resolve_attention(in.attention_kernel()) == fsdp::AttentionKernel::kWrittenOut;
  m.shape = m.description.shape;
  m.shape.sublayer_units = sublayer;
  m.units = m.description.units(sublayer);
  m.frozen = m.description.frozen(sublayer);
  m.nf4 = m.description.nf4(sublayer);
  // (Of the wrap asked for: --params describes that one alone.)
  for (size_t u = 0; u < m.units.size(); ++u) {
    const int64_t whole = m.units[u] + (m.frozen.empty() ? 0 : m.frozen[u]);
    m.trainable_params += m.units[u];
    m.total_params += whole;
    if (u > 0) m.largest_unit = std::max(m.largest_unit, whole);
  }
  return m;
}

// With ZeRO++'s options, "all" means the strategies that accept them; one
// strategy named that refuses them is an error, with fully_shard's reason.
std::vector<fsdp::ShardingStrategy> strategies_asked(const PlanInputs& in) {
  const fsdp::ZeroPlusPlus z = in.zero_plus_plus();
  const int per_node = in.world / in.nodes;
  if (in.strategy != "all") {
    const fsdp::ShardingStrategy s = fsdp::parse_enum<fsdp::ShardingStrategy>(in.strategy);
    fsdp::check_zero_plus_plus_plan(s, in.world, per_node, z);
    return {s};
  }
  std::vector<fsdp::ShardingStrategy> strategies;
  for (auto s : {fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kZero1, fsdp::ShardingStrategy::kShardGradOp,
                 fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kHybridShard,
                 fsdp::ShardingStrategy::kHybridShardZero2}) {
    if (fsdp::is_hybrid(s) && in.nodes == 1) continue;
    try {
      fsdp::check_zero_plus_plus_plan(s, in.world, per_node, z);
    } catch (const c10::Error&) {
      continue;
    }
    strategies.push_back(s);
  }
  TORCH_CHECK(!strategies.empty(), "no strategy accepts these ZeRO++ options");
  return strategies;
}

}  // namespace

// fully_shard's options and the run's settings for strategy `s`, as
// fsdp-train sets them from the same flags (the run's plan: fsdp::plan_run).
fsdp::FullyShardOptions plan_options(const Report& r, fsdp::ShardingStrategy s, bool with_zero_plus_plus) {
  auto options = fsdp::FullyShardOptions()
                     .strategy(s)
                     .mixed_precision(r.mp)
                     .backward_prefetch(r.in.prefetch ? fsdp::BackwardPrefetch::kPre : fsdp::BackwardPrefetch::kNone)
                     .activation_checkpointing(r.in.activation_checkpointing)
                     .zero_plus_plus(with_zero_plus_plus ? r.in.zero_plus_plus() : fsdp::ZeroPlusPlus());
  if (r.in.offload.rfind("nvme", 0) == 0) {
    // Parameters go to disk only where the strategy shards them; room for
    // the gradients only where the step clips or scales the loss, as fsdp-train reserves it.
    const fsdp::RunSettings settings = plan_settings(r);
    options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions("")
                             .optimizer_state(true)
                             .params(r.in.offload == "nvme" && !fsdp::keeps_params_unsharded(s))
                             .read_ahead(r.in.offload_read_ahead)
                             .step_in_backward(!r.in.offload_step_after_backward)
                             .gradient_slots(settings.clips_gradients || settings.scales_loss)));
  }
  return options;
}

fsdp::RunSettings plan_settings(const Report& r) {
  fsdp::RunSettings settings;
  settings.world = r.in.world;
  settings.ranks_per_node = r.per_node;
  settings.clips_gradients = r.in.clip_grad_norm > 0;
  settings.scales_loss = fsdp::scales_loss(fsdp::TrainStepOptions(), r.mp);
  settings.async_checkpoint = r.in.ckpt_async != "none";
  settings.full_checkpoint = r.in.ckpt_async == "full";
  settings.sublayer_units = r.in.wrap == "sublayer";
  settings.sharded_init = r.in.sharded_init;
  return settings;
}

namespace {

Plan plan_strategy(const Report& r, fsdp::ShardingStrategy s) {
  const fsdp::RunPlan run = fsdp::plan_run({r.model.description, plan_options(r, s, true), plan_settings(r)});
  Plan plan{run};
  // What the options add to the memory, against the same strategy without them.
  const fsdp::RunPlan plain = fsdp::plan_run({r.model.description, plan_options(r, s, false), plan_settings(r)});
  plan.quantized_gather_buffers = plan.run.peak.gathered - plain.peak.gathered;
  // Offload keeps fp32 masters, gradient shards and optimizer state in host memory (ZeRO-Offload's split).
  if (r.in.offload == "cpu") plan.host = plan.run.peak.state.total();
  if (r.in.ckpt_async != "none") plan.staging = run.staging;
  plan.preflight = fsdp::host_memory_needed(run, r.in.sharded_init);
  return plan;
}

Recommendation recommend(const PlannedModel& model, int world, int per_node, const fsdp::MixedPrecision& mp,
                         int64_t budget) {
  Recommendation r;
  r.budget = budget;
  r.candidates = fsdp::strategy_candidates(model.units, world, per_node, mp, model.frozen, model.nf4);
  try {
    r.choice = fsdp::choose_strategy(model.units, world, per_node, mp, budget, model.frozen, model.nf4);
    r.reason = r.choice->reason;
  } catch (const c10::Error& e) {  // nothing fits: an answer too, not a failure of the planner
    r.reason = fsdp::error_message(e);
  }
  return r;
}

Report make_report(const PlanInputs& in) {
  check_inputs(in);
  Report r;
  r.in = in;
  r.model = plan_model(in);
  r.mp = fsdp_tools::mixed_precision(in, in);
  r.per_node = in.world / in.nodes;
  for (auto s : strategies_asked(in)) r.plans.push_back(plan_strategy(r, s));
  if (in.budget > 0) {
    r.recommendation =
        recommend(r.model, in.world, r.per_node, r.mp, static_cast<int64_t>(std::llround(in.budget)));
  }
  if (!in.cluster_path.empty()) r.cluster = Cluster::load(in.cluster_path);
  // 6 N FLOPs per token for forward and backward, 2 N more to recompute;
  // or the preset's forward and backward as calibrate timed it.
  r.compute = r.cluster ? (in.activation_checkpointing ? 8.0 : 6.0) * r.model.total_params *
                              static_cast<double>(r.model.shape.batch * r.model.shape.context) / r.cluster->flops
                        : 0.0;
  if (r.cluster && !in.preset.empty() && r.cluster->model_step_preset == in.preset && in.init_from.empty() &&
      !in.layers && !in.width && !in.batch && !in.context && !in.vocab && !in.heads &&
      in.kind() == fsdp::models::ModelKind::kGpt) {
    r.compute = r.cluster->model_step_s * (in.activation_checkpointing ? 8.0 / 6.0 : 1.0);
  }
  r.disk_measured = r.cluster && r.cluster->disk_read_bandwidth > 0 && r.cluster->disk_write_bandwidth > 0;
  return r;
}

// Runs `body`, printing an error as fsdp-plan's and returning 1 for it.
template <class Body>
int reporting_errors(Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << "fsdp-plan: error: " << fsdp::error_message(e) << "\n";
    return 1;
  }
}

}  // namespace
}  // namespace fsdp_plan

int main(int argc, char** argv) {
  CLI::App app{"The memory planner: per-rank memory, communication and step time of each sharding strategy."};
  fsdp_plan::PlanInputs in;
  fsdp_plan::add_plan_options(app, in);
  auto* calibrate_cmd = app.add_subcommand("calibrate", "measure FLOP/s and all-gather bandwidth here (under fsdp-run)");
  fsdp_plan::CalibrateOptions calibration;
  std::string& disk_dir = calibration.disk_dir;
  int64_t disk_mib = 1024;
  calibrate_cmd->add_option("--preset", calibration.preset,
                            "also time one forward and backward of this preset's model on every rank at once "
                            "(model_step: the step's compute on these cores)");
  calibrate_cmd->add_option("--ranks-per-node", calibration.ranks_per_node,
                            "with --preset: also time the collectives a step runs at its largest unit's size, with "
                            "hosts of this many consecutive ranks (collectives: counted bytes per second)");
  calibrate_cmd->add_option("--reps", calibration.reps, "repetitions of each collective")->check(fsdp_tools::positive())->capture_default_str();
  calibrate_cmd->add_option("--offload-dir", disk_dir,
                            "also measure the disk there: each rank writes and reads back --disk-mib MiB at once, "
                            "through the engine offloading would use (disk_write_bandwidth, disk_read_bandwidth)");
  calibrate_cmd->add_option("--disk-mib", disk_mib, "MiB per rank for the disk measurement")->check(fsdp_tools::positive())->capture_default_str();
  if (const auto status = fsdp_tools::parse_command_line(app, argc, argv)) return *status;
  if (calibrate_cmd->parsed()) {
    return fsdp_plan::reporting_errors([&] {
      TORCH_CHECK(disk_mib > 0, "--disk-mib must be positive, got ", disk_mib);
      calibration.disk_bytes = disk_mib << 20;
      return fsdp_plan::calibrate(&argc, &argv, calibration);
    });
  }
  return fsdp_plan::reporting_errors([&] {
    const fsdp_plan::Report report = fsdp_plan::make_report(in);
    for (const std::string& warning : report.model.ignored) std::cerr << "fsdp-plan: warning: " << warning << "\n";
    // The plan's step times are this machine's: bf16 without bf16 instructions is not what it should plan for.
    if (report.mp.param_dtype() == torch::kBFloat16 || report.mp.effective_frozen_param_dtype() == torch::kBFloat16) {
      const std::string bf16 = fsdp::cpu_bf16_warning();
      if (!bf16.empty()) std::cerr << "fsdp-plan: warning: " << bf16 << "\n";
    }
    if (in.json) {
      fsdp_plan::print_json(report);
    } else {
      fsdp_plan::print_text(report);
    }
    return 0;
  });
}
