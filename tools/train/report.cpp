// fsdp-train's reporting: banner, progress, log records; the figures of the
// steps and what the planner predicted (the end of the run: summary.cpp).

#include "train/report.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/host_memory.h"
#include "base/strings.h"
#include "core/host_resources.h"
#include "fsdp/hugging_face.h"
#include "fsdp/offload.h"
#include "train/report_util.h"
#include "models/attention_kernel.h"
#include "core/strategy_rules.h"
#include "state_dict/hugging_face_files.h"

namespace fsdp_train {

using fsdp::format_mib;

NvmeReport nvme_report(const fsdp::FsdpState& state) {
  NvmeReport report;
  const std::optional<fsdp::offload::NvmeOffloadInfo> nvme = state.nvme_offload();
  if (!nvme) return report;
  report.on = true;
  report.optimizer_state = nvme->optimizer_state;
  report.params = nvme->params;
  report.path = nvme->file_path;
  report.engine = nvme->engine_description;
  report.offloaded_bytes = nvme->offloaded_bytes;
  report.file_bytes = nvme->offloaded_bytes;  // the scratch file holds exactly the offloaded state
  return report;
}

namespace {

// The ranks of a host as the state formed its groups: the option (or
// fsdp-run's), else the groups MPI's shared memory made, else mpirun's
// count of the ranks on this host.
int ranks_per_host(const Run& run, const fsdp::FsdpState& state, int world) {
  if (run.fsdp_options.ranks_per_node() > 0) return run.fsdp_options.ranks_per_node();
  if (state.host_group()) return state.host_group()->size();
  if (fsdp::is_hybrid(run.fsdp_options.strategy()) && state.shard_group()) return state.shard_group()->size();
  return fsdp::ranks_on_this_host(world);
}

}  // namespace

Predictions predict(const TrainOptions& o, const Run& run, const fsdp::FsdpState& state, int64_t num_params,
                    int world) {
  const fsdp::RunPlan plan = fsdp::plan_run(
      {run.plan_description, run.fsdp_options,
       run_settings(o, run, world, ranks_per_host(run, state, world), state.gathers_run_ahead())});
  Predictions p;
  p.num_params = num_params;
  p.unit_numels = plan.unit_numels;
  p.shard_group_size = plan.shard_group;
  p.state = plan.peak.state;
  p.peak = plan.peak;
  p.nvme = plan.nvme;
  p.peak_bytes = plan.step_peak;
  const fsdp::TransformerShape shape = run.model_config.shape();
  p.tokens_per_step = shape.batch * shape.context * world * o.grad_accum;
  p.ranks_per_node = plan.ranks_per_node;
  p.comm = plan.comm;
  p.checkpoint_staging = plan.staging.rank0;
  return p;
}

void RunFigures::record(const fsdp::StepResult& result, const fsdp::CommStats& cross_host, int64_t step,
                        int64_t steps, int rank) {
  skipped_steps += result.stepped ? 0 : 1;
  last_comm = result.comm;
  last_cross_host_comm = cross_host;
  last_usage = fsdp::memory::usage();  // TrainStep restarted the peaks at the step's start
  final_loss = result.loss;
  if (step == first_step) offload_first_read_ahead = result.offload_read_ahead;
  offload_last_read_ahead = result.offload_read_ahead;
  if (step > first_step || steps == first_step + 1) {
    step_times.push_back(result.step_s);
    exposed_comm_times.push_back(result.comm.wait_seconds);
    optimizer_times.push_back(result.optimizer_s);
    offload_wait_times.push_back(result.offload_wait_s);
    offload_read.push_back(static_cast<double>(result.offload_bytes_read));
    offload_written.push_back(static_cast<double>(result.offload_bytes_written));
    offload_copy_times.push_back(result.offload_copy_s);
    offload_checksum_times.push_back(result.offload_checksum_s);
    offload_disk_times.push_back(result.offload_disk_s);
  }
  if (rank != 0) return;
  last_figures = result.per_rank;
  max_peak.resize(last_figures.size(), 0);
  for (size_t r = 0; r < last_figures.size(); ++r) max_peak[r] = std::max(max_peak[r], last_figures[r].peak_tensor_bytes);
}

// TrainStep restarts the allocator's peak at every step, so what came
// between steps (construction, evaluation) is folded in before each one,
// and the step's own after it.
void RunFigures::fold_device_peak(c10::Device device) {
  const fsdp::memory::DeviceUsage now = fsdp::memory::device_usage(device);
  run_device_peak.peak_allocated = std::max(run_device_peak.peak_allocated, now.peak_allocated);
  run_device_peak.peak_reserved = std::max(run_device_peak.peak_reserved, now.peak_reserved);
}

namespace {

// The disk offload's and --init-from's lines of the banner.
void print_nvme_and_init(const ReportContext& c) {
  const TrainOptions& o = c.o;
  if (c.nvme.on) {
    std::cout << "  nvme offload: " << (c.nvme.optimizer_state ? "optimizer state" : "")
              << (c.nvme.optimizer_state && c.nvme.params ? " and " : "") << (c.nvme.params ? "parameters" : "")
              << " in " << c.nvme.path << " (" << c.nvme.engine << "), " << format_mib(c.nvme.offloaded_bytes)
              << " per rank on disk\n";
  }
  const bool shape_only = !o.init_from.empty() && !fsdp::hugging_face::is_model(o.init_from) &&
                          std::filesystem::path(o.init_from).extension() == ".json";
  if (!o.init_from.empty() && !shape_only) {
    const bool folder = fsdp::hugging_face::is_model(o.init_from);  // or its model.safetensors
    const double mb = (folder ? fsdp::hugging_face::find_model(o.init_from).weight_bytes()
                              : static_cast<int64_t>(std::filesystem::file_size(o.init_from))) / 1e6;
    std::cout << "  initialized from " << o.init_from << " (" << std::fixed << std::setprecision(1) << mb
              << " MB in " << std::setprecision(2) << c.run.init_seconds << " s"
              << (folder ? ", each rank reading its own shards, " : " on each rank, ") << std::setprecision(0)
              << mb / c.run.init_seconds << " MB/s; rank 0's peak RSS " << format_mib(c.run.init_peak_rss)
              << " by then)\n";
  }
}

// ZeRO++'s line of the banner, when an option is on.
void print_zero_plus_plus(const ReportContext& c) {
  const fsdp::ZeroPlusPlus& z = c.run.fsdp_options.zero_plus_plus();
  if (!z.any()) return;
  std::cout << "  ZeRO++: gather " << fsdp::enum_name(z.gather_quantization()) << ", secondary partition "
            << (z.secondary_partition() ? "on" : "off") << ", gradients "
            << fsdp::enum_name(z.gradient_quantization()) << ", blocks of " << z.quantization_block()
            << "; hosts of " << c.predicted.ranks_per_node << " rank(s)";
  if (c.state.host_group()) std::cout << " (host group of " << c.state.host_group()->size() << ")";
  if (c.state.cross_host_group()) std::cout << ", cross-host group of " << c.state.cross_host_group()->size();
  std::cout << "\n";
}

// Where the model's shape came from: --init-from's config.json, or the
// preset with the options that override it.
std::string shape_source(const TrainOptions& o) {
  if (!o.init_from.empty() && fsdp::hugging_face::is_model(o.init_from)) {
    return "shape from " + fsdp::hugging_face::find_model(o.init_from).config;
  }
  if (std::filesystem::path(o.init_from).extension() == ".json") {
    return "shape from " + o.init_from + " (no weights: the model's own init)";
  }
  std::string overrides;
  for (const auto& [flag, value] : {std::pair<const char*, std::optional<int64_t>>{"--vocab", o.vocab},
                                    {"--context", o.context}, {"--layers", o.layers}, {"--heads", o.heads},
                                    {"--width", o.width}, {"--kv-heads", o.kv_heads}}) {
    if (value) overrides += std::string(overrides.empty() ? " with " : ", ") + flag + " " + std::to_string(*value);
  }
  return "preset " + o.preset + overrides;
}

// The family's name in the banner.
const char* family_title(fsdp::models::ModelKind kind) {
  switch (kind) {
    case fsdp::models::ModelKind::kGpt: return "GPT";
    case fsdp::models::ModelKind::kLlama: return "Llama";
  }
  return "?";
}

// The banner's attention line: the kernel LibTorch picks for the run's heads
// (fsdp::describe_attention), or why the attention is written out.
std::string attention_description(const Run& run, torch::ScalarType dtype) {
  const fsdp::models::ModelConfig& config = run.model_config;
  const fsdp::TransformerShape shape = config.shape();
  int64_t kv_heads = shape.heads, head_dim = shape.width / shape.heads;
  if (config.kind() == fsdp::models::ModelKind::kLlama) {
    kv_heads = config.llama().kv_heads;
    head_dim = config.llama().head_dim();
  }
  return fsdp::describe_attention(config.attention(), torch::TensorOptions().dtype(dtype).device(run.device),
                                  shape.heads, kv_heads, head_dim);
}

// The banner's data line: the tokens and their split, or the conversations,
// their rows and how they attend.
std::string data_description(const TrainOptions& o, const Run& run) {
  std::ostringstream out;
  const std::string order = o.data_order + " order, seed " + std::to_string(o.data_seed);
  if (run.data) {
    out << run.data->path() << " (" << run.data->size() << " tokens, " << run.data->val_size()
        << " held out for validation; " << order << ")";
    return out.str();
  }
  const fsdp::models::ConversationData& c = *run.conversations;
  out << c.path() << ": " << c.train_conversations() << " conversations in " << c.train_rows() << " rows of "
      << run.model_config.shape().context << " (" << (o.pack ? "packed best-fit" : "one a row, padded")
      << ", packing efficiency " << std::setprecision(3) << 100.0 * c.packing_efficiency() << " %), "
      << c.train_loss_targets() << " answer tokens an epoch, " << c.val_conversations()
      << " held out for validation; " << order;
  if (c.truncated() > 0) out << "; " << c.truncated() << " cut to --context + 1 tokens";
  if (c.skipped() > 0) out << "; " << c.skipped() << " without an answer token left out";
  out << "\n  conversations: the loss on answer tokens only, its mean over the global batch's; each attends only "
      << "to itself (a block-diagonal causal mask of T x T bytes a row), positions restarting at each";
  return out.str();
}

}  // namespace

std::string lora_description(const Run& run, const TrainOptions& o) {
  if (!run.fine_tuned.lora) return "";
  const fsdp::lora::LoraOptions& l = *run.fine_tuned.lora;
  std::ostringstream out;
  out << "LoRA r=" << l.rank() << " alpha=" << l.alpha();
  if (l.dropout() > 0) out << " dropout=" << l.dropout();
  out << " on " << run.fine_tuned.adapted.size() << " linears (" << c10::Join(",", l.targets()) << ")";
  if (!o.init_from_adapter.empty()) out << ", from the adapter " << o.init_from_adapter;
  return out.str();
}

void print_banner(const ReportContext& c) {
  const TrainOptions& o = c.o;
  const Run& run = c.run;
  const auto& mp = run.fsdp_options.mixed_precision();
  const fsdp::FsdpState& state = c.state;
  const int W = c.world_size;
  const bool scaling = c.train_step.scaler() != nullptr, skip_sync = c.train_step.syncs_only_last_micro_step();
  std::cout << "fsdp-train: " << family_title(run.model_config.kind()) << ", " << shape_source(o) << " ("
            << run.model->describe() << "), " << c.predicted.num_params << " parameters";
  if (!o.freeze.empty()) {
    std::cout << ", " << run.trainable_params << " trainable (--freeze '" << o.freeze << "' froze "
              << c.predicted.num_params - run.trainable_params << ")";
  } else if (run.fine_tuned.lora) {
    std::cout << ", " << run.trainable_params << " trainable (" << lora_description(run, o) << ")";
  }
  std::cout << "\n"
            << "  " << fsdp::enum_name(run.fsdp_options.strategy()) << " over " << W << " rank(s)";
  if (state.shard_group()) std::cout << ", shard group of " << state.shard_group()->size();
  if (state.replicate_group()) std::cout << ", replicate group of " << state.replicate_group()->size();
  std::cout << ", " << state.num_units() << " units (wrap " << o.wrap << "), " << torch::get_num_threads()
            << " thread(s) per rank\n"
            << "  params " << fsdp::enum_name(mp.param_dtype()) << ", reduce "
            << fsdp::enum_name(mp.effective_reduce_dtype()) << (scaling ? " with loss scaling" : "") << ", "
            << o.grad_accum << " micro-step(s) per step" << (skip_sync ? " (reduced on the last)" : "") << ", "
            << c.predicted.tokens_per_step << " tokens per step\n"
            << "  prefetch: forward " << (o.forward_prefetch ? "on" : "off") << ", backward " << o.backward_prefetch
            << ", depth " << o.prefetch_depth << (o.no_limit_all_gathers ? ", unlimited" : ", limited to one unit ahead")
            << "; activation checkpointing " << (o.activation_checkpointing ? "on" : "off") << "\n"
            << "  attention: " << attention_description(run, mp.param_dtype()) << "\n"
            << "  AdamW (" << (o.adamw == "fused" ? "fsdp::FusedAdamW" : "torch::optim::AdamW") << "): lr "
            << run.schedule.describe() << "; weight decay " << o.weight_decay << " (matrices only); clip grad norm "
            << o.clip_grad_norm << " (0: off)\n"
            << "  data: " << data_description(o, run) << "\n";
  if (run.tokenizer) {
    std::cout << "  tokenizer: " << run.tokenizer->path() << " (" << run.tokenizer->vocab_size()
              << " ids; the prompt encoded, the sample decoded"
              << (run.data ? ", validation also in bits per byte)\n" : ")\n");
  }
  if (!run.strategy_reason.empty()) std::cout << "  " << run.strategy_reason << "\n";
  print_zero_plus_plus(c);
  print_nvme_and_init(c);
  const fsdp::ModelStateBytes& predicted = c.predicted.state;
  std::cout << "  construction (model built and sharded" << (o.sharded_init ? ", sharded initialization" : "")
            << "): rank 0's tensor memory peaked at " << format_mib(c.predicted.construction_peak) << "\n";
  std::cout << "  per-rank model state by formula: " << predicted.total() << " B (params " << predicted.params
            << ", grads " << predicted.grads << ", optimizer " << predicted.optimizer << ")";
  if (predicted.frozen_params > 0) std::cout << ", of the params the frozen parameters' " << predicted.frozen_params;
  std::cout << "\n";
  if (o.ckpt_async && !o.ckpt_dir.empty()) {
    std::cout << "  checkpoints in the background (--ckpt-async): rank 0's staging copy "
              << format_mib(c.predicted.checkpoint_staging) << ", held beside the steps until written\n";
  }
  std::cout << std::flush;
}

void print_resumed(const fsdp::CheckpointResume& resumed) {
  const double mb = directory_bytes(resumed.info.path) / 1e6;
  std::cout << "  resumed from " << resumed.info.path << " (step " << resumed.info.step << ", saved by "
            << resumed.info.world_size << " ranks with " << resumed.info.strategy << "); loaded " << std::fixed
            << std::setprecision(1) << mb << " MB in " << std::setprecision(2) << resumed.seconds << " s ("
            << std::setprecision(0) << mb / resumed.seconds << " MB/s)\n";
}

void print_saved(const fsdp::CheckpointSave& saved) {
  if (saved.background) {
    const double mb = saved.staged_bytes / 1e6;
    std::cout << "  checkpoint: " << saved.path << " staged (" << std::fixed << std::setprecision(1) << mb
              << " MB on rank 0 in " << std::setprecision(2) << saved.staging_seconds << " s, " << std::setprecision(0)
              << mb / std::max(saved.staging_seconds, 1e-9) << " MB/s), writing in the background";
    if (saved.waited_seconds > 0) {
      std::cout << "; waited " << std::setprecision(2) << saved.waited_seconds
                << " s for the previous save's background write (one save in flight at a time)";
    }
    std::cout << "; training blocked " << std::setprecision(2) << saved.seconds << " s\n" << std::flush;
    return;
  }
  const double mb = directory_bytes(saved.path) / 1e6;
  std::cout << "  checkpoint: " << saved.path << " (" << std::fixed << std::setprecision(1) << mb << " MB in "
            << std::setprecision(2) << saved.seconds << " s, " << std::setprecision(0) << mb / saved.seconds
            << " MB/s; rank 0's tensor memory peaked " << format_mib(saved.peak_extra_bytes)
            << " above its live bytes)\n"
            << std::flush;
}

void print_published(const fsdp::CheckpointSave& saved) {
  const double mb = directory_bytes(saved.path) / 1e6;
  std::cout << "  checkpoint: " << saved.path << " written in the background and published (" << std::fixed
            << std::setprecision(1) << mb << " MB in " << std::setprecision(2) << saved.write_seconds
            << " s on the slowest rank, " << std::setprecision(0) << mb / std::max(saved.write_seconds, 1e-9)
            << " MB/s)\n"
            << std::flush;
}

void RunFigures::record_save(const fsdp::CheckpointSave& saved) {
  checkpoints.blocked_this_step += saved.seconds;
  checkpoints.blocked_s.push_back(saved.seconds);
  checkpoints.staging_s += saved.staging_seconds;
  checkpoints.staged_bytes += saved.staged_bytes;
  checkpoints.waited_s += saved.waited_seconds;
  checkpoints.waited += saved.waited_seconds > 0 ? 1 : 0;
  if (saved.published) ++checkpoints.published;
}

void RunFigures::record_published(const fsdp::CheckpointSave& saved) {
  checkpoints.background_write_s += saved.write_seconds;
  ++checkpoints.published;
}

namespace {

void write_log_record(const ReportContext& c, const RunFigures& figures, const fsdp::StepResult& result, int64_t step,
                      double lr, const std::optional<double>& val_loss) {
  const int W = c.world_size;
  const auto& f = figures.last_figures;
  std::vector<int64_t> model_state(W), peak(W);
  for (int r = 0; r < W; ++r) {
    model_state[r] = f[r].model_state_bytes;
    peak[r] = f[r].peak_tensor_bytes;
  }
  nlohmann::json line = {{"step", step + 1},
                         {"loss", figures.final_loss},
                         {"step_s", result.step_s},
                         {"tokens_per_s", c.predicted.tokens_per_step / result.step_s},
                         {"lr", lr},
                         {"world_size", W},
                         {"strategy", fsdp::enum_name(c.run.fsdp_options.strategy())},
                         {"comm_bytes", comm_bytes_json(result.comm)},
                         {"cross_host_bytes", total_bytes(figures.last_cross_host_comm)},
                         {"inside_host_bytes", total_bytes(result.comm) - total_bytes(figures.last_cross_host_comm)},
                         {"exposed_comm_s", result.comm.wait_seconds},
                         {"optimizer_s", result.optimizer_s},
                         {"offload_bytes_read", result.offload_bytes_read},
                         {"offload_bytes_written", result.offload_bytes_written},
                         {"offload_wait_s", result.offload_wait_s},
                         {"offload_bytes_staged", result.offload_bytes_staged},
                         {"offload_read_ahead", result.offload_read_ahead},
                         {"offload_io_thread_s", {{"copy", result.offload_copy_s},
                                                  {"checksum", result.offload_checksum_s},
                                                  {"disk", result.offload_disk_s}}},
                         {"model_state_bytes", model_state},
                         {"peak_tensor_bytes", peak}};
  if (!c.o.ckpt_dir.empty()) {  // what the checkpoints cost this step
    line["checkpoint_blocked_s"] = figures.checkpoints.blocked_this_step;
    line["checkpoint_in_flight"] = figures.checkpoints.in_flight_this_step;
  }
  if (!c.run.device.is_cpu()) {  // the GPU's figures beside the host's (per rank)
    for (int r = 0; r < W; ++r) {
      line["device_peak_bytes"].push_back(f[r].device_peak_bytes);
      line["device_model_state_bytes"].push_back(f[r].device_model_state_bytes);
      line["device_gathered_peak_bytes"].push_back(f[r].device_gathered_peak_bytes);
    }
  }
  const double grad_norm = result.grad_norm.value_or(-1.0);
  if (grad_norm >= 0) line["grad_norm"] = grad_norm;
  if (val_loss) line["val_loss"] = *val_loss;
  if (val_loss && figures.final_val_bpb) line["val_bpb"] = *figures.final_val_bpb;
  if (const fsdp::GradScaler* scaler = c.train_step.scaler()) {
    line["skipped"] = !result.stepped;
    line["loss_scale"] = scaler->scale_factor();
  }
  c.run.log << line.dump() << "\n" << std::flush;
}

}  // namespace

void report_step(const ReportContext& c, const RunFigures& figures, const fsdp::StepResult& result, int64_t step,
                 double lr, const std::optional<double>& val_loss) {
  const TrainOptions& o = c.o;
  if (c.run.log.is_open()) write_log_record(c, figures, result, step, lr, val_loss);
  const int64_t print_every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 20);
  // Every print_every steps, the first and the last, and every evaluation's.
  if ((step + 1) % print_every != 0 && step != 0 && step + 1 != o.steps && !figures.preempted_after && !val_loss) return;
  const double step_s = result.step_s;
  const double typical = figures.step_times.empty() ? step_s : median(figures.step_times);
  std::cout << "step " << std::setw(5) << step + 1 << "/" << o.steps << " | loss " << std::fixed << std::setprecision(4)
            << figures.final_loss << " | " << std::setprecision(0) << c.predicted.tokens_per_step / step_s
            << " tok/s | " << std::setprecision(3) << step_s << " s/step | ETA "
            << human_seconds(typical * static_cast<double>(o.steps - step - 1));
  if (val_loss) std::cout << " | val loss " << std::setprecision(4) << *val_loss;
  if (val_loss && figures.final_val_bpb) std::cout << " (" << std::setprecision(3) << *figures.final_val_bpb << " bits/byte)";
  if (!result.stepped) std::cout << " | skipped (overflow)";
  std::cout << "\n" << std::flush;
}

}  // namespace fsdp_train
