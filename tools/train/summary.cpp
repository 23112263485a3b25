// fsdp-train's end of run: the figures every rank contributes, --summary's
// JSON object, and the printout.

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "plan/host_memory.h"
#include "base/strings.h"
#include "core/host_resources.h"
#include "fsdp/hugging_face.h"
#include "train/report.h"
#include "tool_support.h"
#include "train/report_util.h"
#include "models/attention_kernel.h"

namespace fsdp_train {

using fsdp::format_mib;

EndFigures gather_end_figures(const fsdp::ProcessGroupPtr& world, RunFigures& figures, c10::Device device) {
  const int W = world->size();
  EndFigures end;
  // Every rank's peak resident set (the runtime included), for the summary.
  const int64_t peak_rss = fsdp_tools::peak_rss_bytes();
  // The GPU's peak over the run (the CUDA caching allocator's), the largest
  // of any rank: 0 on the CPU.
  figures.fold_device_peak(device);
  torch::Tensor device_peaks = torch::empty({W, 2}, torch::kLong);
  world->all_gather(device_peaks, torch::tensor({figures.run_device_peak.peak_allocated,
                                                 figures.run_device_peak.peak_reserved},
                                                torch::kLong))
      ->wait();
  end.peak_device = device_peaks.select(1, 0).max().item<int64_t>();
  end.peak_device_reserved = device_peaks.select(1, 1).max().item<int64_t>();
  torch::Tensor rss = torch::empty({W}, torch::kLong);
  world->all_gather(rss, torch::tensor({peak_rss}, torch::kLong))->wait();
  end.rss.assign(rss.data_ptr<int64_t>(), rss.data_ptr<int64_t>() + W);
  return end;
}

namespace {

// The summary's memory figures: per rank, by category, on the host and the device.
void add_memory(nlohmann::json& summary, const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  const int W = c.world_size;
  const auto& f = figures.last_figures;
  nlohmann::json peak_by_category;  // each category's own peak in the last step (they need not coincide)
  const fsdp::memory::Usage& usage_last = figures.last_usage;
  for (size_t k = 0; k < fsdp::memory::kNumCategories; ++k) {
    const auto category = static_cast<fsdp::memory::Category>(k);
    peak_by_category[fsdp::enum_name(category)] = usage_last.peak(category);
  }
  std::vector<int64_t> model_state(W);
  for (int r = 0; r < W; ++r) model_state[r] = f[r].model_state_bytes;
  nlohmann::json model_state_by_kind;  // per rank, split as fsdp-plan splits it
  nlohmann::json device_model_state = nlohmann::json::array();
  for (int r = 0; r < W; ++r) device_model_state.push_back(f[r].device_model_state_bytes);
  // The device's memory by category, per rank (the last step's): model
  // state by kind at the step's end, and the peak of the gathered
  // parameter buffers (ours, exact); the caching allocator's totals are
  // peak_device_bytes and peak_device_reserved_bytes.
  nlohmann::json device_by_category = nlohmann::json::object();
  if (!c.run.device.is_cpu()) {
    for (int r = 0; r < W; ++r) {
      device_by_category["params"].push_back(f[r].device_param_shard_bytes);
      device_by_category["grads"].push_back(f[r].device_grad_shard_bytes);
      device_by_category["optimizer"].push_back(f[r].device_optimizer_state_bytes);
      device_by_category["gathered_peak"].push_back(f[r].device_gathered_peak_bytes);
      device_by_category["step_peak"].push_back(f[r].device_peak_bytes);
    }
  }
  for (int r = 0; r < W; ++r) {
    model_state_by_kind["params"].push_back(f[r].param_shard_bytes);
    model_state_by_kind["grads"].push_back(f[r].grad_shard_bytes);
    model_state_by_kind["optimizer"].push_back(f[r].optimizer_state_bytes);
  }
  const Predictions& p = c.predicted;
  summary["construction_peak_bytes"] = p.construction_peak;
  summary["peak_device_bytes"] = end.peak_device;
  summary["peak_device_reserved_bytes"] = end.peak_device_reserved;
  summary["device_model_state_bytes"] = device_model_state;
  summary["device_memory_by_category"] = device_by_category;
  // The planner's step peak as fsdp-plan --offload splits it: with
  // offload the model state is on the host (CPU kernels' activations).
  summary["peak_device_bytes_predicted"] =
      c.run.device.is_cpu() ? int64_t{0} : p.peak.total() - (c.o.offload == "cpu" ? p.peak.state.total() : 0);
  summary["peak_tensor_bytes"] = figures.max_peak;
  summary["model_state_bytes"] = model_state;
  summary["model_state_bytes_predicted"] = p.state.total();
  summary["peak_tensor_bytes_predicted"] = p.peak_bytes;
  summary["peak_rss_bytes"] = end.rss;
  summary["ram_bytes_predicted"] = c.run.ram_predicted;
  summary["ram_bytes_predicted_all_ranks"] = c.run.ram_predicted_all_ranks;  // against peak_rss_bytes' sum
  summary["ram_bytes_predicted_read_ahead_max"] = c.run.ram_predicted_deepest;  // the bound where the read-ahead deepens
  summary["last_step_peak_by_category_rank0"] = peak_by_category;
  summary["model_state_bytes_by_kind"] = model_state_by_kind;
  summary["block_cache_bytes"] = fsdp::memory::block_cache_limit();
  // The last step's peak of tensors plus the block cache's freed blocks: what of the RSS the tensors hold.
  summary["last_step_peak_reserved_bytes_rank0"] = fsdp::memory::usage().peak_reserved;
}

// The summary's disk offload figures (measured medians and the planner's).
void add_offload(nlohmann::json& summary, const ReportContext& c, const RunFigures& figures) {
  const auto& plan = c.predicted.nvme;
  summary["offload_optimizer"] = c.o.offload_optimizer;
  summary["offload_params"] = c.o.offload_params;
  summary["offload_engine"] = c.nvme.on ? c.nvme.engine : "";
  summary["offload_file_bytes"] = c.nvme.on ? c.nvme.file_bytes : 0;
  summary["offload_file_bytes_predicted"] = plan ? plan->file_bytes : 0;
  summary["offload_read_bytes_per_step"] = median(figures.offload_read);
  summary["offload_written_bytes_per_step"] = median(figures.offload_written);
  summary["offload_io_bytes_per_step_predicted"] = plan ? plan->io_per_step() : 0;
  summary["offload_wait_s"] = median(figures.offload_wait_times);
  summary["offload_read_ahead"] = figures.offload_last_read_ahead;  // rank 0's, in the last step
  summary["offload_read_ahead_max"] = c.nvme.on ? c.run.fsdp_options.offload().nvme_options()->max_read_ahead() : 0;
  summary["offload_io_thread_s"] = {{"copy", median(figures.offload_copy_times)},
                                    {"checksum", median(figures.offload_checksum_times)},
                                    {"disk", median(figures.offload_disk_times)}};
}

// The summary's communication: rank 0's bytes of the last step by kind,
// across hosts and inside one, beside the planner's (the same ZeRO++
// options, hosts of ranks_per_node ranks).
void add_comm(nlohmann::json& summary, const ReportContext& c, const RunFigures& figures) {
  const fsdp::CommBytes& plan = c.predicted.comm;
  const int64_t cross_host = total_bytes(figures.last_cross_host_comm);
  summary["comm_bytes"] = comm_bytes_json(figures.last_comm);
  summary["cross_host_bytes"] = cross_host;
  summary["inside_host_bytes"] = total_bytes(figures.last_comm) - cross_host;
  summary["comm_bytes_predicted"] = {{"all_gather", plan.all_gather},
                                     {"reduce_scatter", plan.reduce_scatter},
                                     {"all_reduce", plan.all_reduce},
                                     {"all_to_all", plan.all_to_all}};
  summary["cross_host_bytes_predicted"] = plan.cross_host;
  summary["inside_host_bytes_predicted"] = plan.inside_host();
}

// The ZeRO++ options as the run used them.
void add_zero_plus_plus(nlohmann::json& summary, const ReportContext& c) {
  const fsdp::ZeroPlusPlus& z = c.run.fsdp_options.zero_plus_plus();
  summary["ranks_per_node"] = c.predicted.ranks_per_node;
  summary["gather_quantization"] = fsdp::enum_name(z.gather_quantization());
  summary["secondary_partition"] = z.secondary_partition();
  summary["gradient_quantization"] = fsdp::enum_name(z.gradient_quantization());
  summary["quantization_block"] = z.quantization_block();
}

// LoRA's settings (null without LoRA).
nlohmann::json lora_json(const ReportContext& c) {
  if (!c.run.fine_tuned.lora) return nullptr;
  const fsdp::lora::LoraOptions& l = *c.run.fine_tuned.lora;
  return {{"rank", l.rank()},
          {"alpha", l.alpha()},
          {"dropout", l.dropout()},
          {"targets", l.targets()},
          {"adapted_linears", c.run.fine_tuned.adapted.size()},
          {"init_from_adapter", c.o.init_from_adapter.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.o.init_from_adapter)},
          {"description", lora_description(c.run, c.o)}};
}

// The summary's configuration and timing.
nlohmann::json run_summary(const ReportContext& c, const RunFigures& figures) {
  const TrainOptions& o = c.o;
  const auto& mp = c.run.fsdp_options.mixed_precision();
  const double typical = median(figures.step_times);
  return {{"model", o.model},
          {"preset", o.preset},
          {"world_size", c.world_size},
          {"parameters", c.predicted.num_params},
          {"trainable_parameters", c.run.trainable_params},
          {"lora", lora_json(c)},
          {"strategy", fsdp::enum_name(c.run.fsdp_options.strategy())},
          {"param_dtype", fsdp::enum_name(mp.param_dtype())},
          {"reduce_dtype", fsdp::enum_name(mp.effective_reduce_dtype())},
          {"forward_prefetch", o.forward_prefetch},
          {"backward_prefetch", o.backward_prefetch},
          {"activation_checkpointing", o.activation_checkpointing},
          {"wrap", o.wrap},
          {"attention", fsdp::enum_name(fsdp::resolve_attention(c.run.model_config.attention()))},
          {"threads_per_rank", torch::get_num_threads()},
          {"adamw", o.adamw},
          {"device", c.run.device.str()},
          {"backend", c.run.backend},
          {"offload", o.offload},
          {"libtorch", c10::str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)},
          {"steps", o.steps},
          {"final_loss", figures.final_loss},
          {"step_s", typical},
          {"tokens_per_s", c.predicted.tokens_per_step / typical},
          {"exposed_comm_s", median(figures.exposed_comm_times)},
          {"optimizer_s", median(figures.optimizer_times)},
          {"units", c.state.num_units()},
          {"shard_group_size", c.predicted.shard_group_size},
          {"replicate_group_size", c.state.replicate_group() ? c.state.replicate_group()->size() : 1},
          {"prefetch_depth", o.prefetch_depth},
          {"limit_all_gathers", !o.no_limit_all_gathers},
          {"first_step", figures.first_step},
          {"preempted_after_step",
           figures.preempted_after ? nlohmann::json(figures.preempted_after) : nlohmann::json()},
          {"resumed_from", figures.resumed_from.empty() ? nlohmann::json() : nlohmann::json(figures.resumed_from)},
          {"data_order", o.data_order},
          {"data_seed", o.data_seed},
          {"val_fraction", o.val_fraction}};
}

}  // namespace

namespace {
// --ckpt-dir: the saves' time blocking training, and --ckpt-async's background.
void add_checkpoints(nlohmann::json& summary, const ReportContext& c, const RunFigures& figures) {
  if (c.o.ckpt_dir.empty()) return;
  const auto& k = figures.checkpoints;
  double blocked = 0.0, most = 0.0;
  for (double s : k.blocked_s) {
    blocked += s;
    most = std::max(most, s);
  }
  summary["checkpoint"] = {{"async", c.o.ckpt_async},
                           {"format", c.o.ckpt_format},
                           {"saves", k.blocked_s.size()},
                           {"published", k.published},
                           {"blocked_s", blocked},
                           {"blocked_max_s", most},
                           {"staging_s", k.staging_s},
                           {"staged_bytes", k.staged_bytes},
                           {"waited_s", k.waited_s},
                           {"saves_waited", k.waited},
                           {"background_write_s", k.background_write_s}};
}
// Conversations: what was trained on, how full the rows were, what was cut.
void add_conversations(nlohmann::json& summary, const ReportContext& c, const RunFigures& figures) {
  const fsdp::models::ConversationData& data = *c.run.conversations;
  summary["conversations"] = {{"answer_tokens_trained", figures.answer_tokens},
                              {"train_conversations", data.train_conversations()},
                              {"val_conversations", data.val_conversations()},
                              {"rows", data.train_rows()},
                              {"packed", c.o.pack},
                              {"packing_efficiency", data.packing_efficiency()},
                              {"truncated", data.truncated()},
                              {"without_answer", data.skipped()}};
}
}  // namespace

void write_summary(const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  nlohmann::json summary = run_summary(c, figures);
  add_zero_plus_plus(summary, c);
  add_comm(summary, c, figures);
  add_memory(summary, c, figures, end);
  add_offload(summary, c, figures);
  add_checkpoints(summary, c, figures);
  if (!c.run.strategy_reason.empty()) summary["strategy_reason"] = c.run.strategy_reason;
  if (c.run.conversations) add_conversations(summary, c, figures);
  if (figures.final_val_loss) {
    summary["final_val_loss"] = *figures.final_val_loss;
    summary["eval_sequences"] = figures.eval_sequences;
    if (figures.final_val_bpb) summary["final_val_bpb"] = *figures.final_val_bpb;
  }
  std::ofstream out(c.o.summary);
  out << summary.dump() << "\n";
  TORCH_CHECK(out.good(), "writing the summary '", c.o.summary, "' failed");
}

namespace {

// Loss, validation, throughput, the step's time split, the disk offload's traffic.
void print_training(const ReportContext& c, const RunFigures& figures) {
  const TrainOptions& o = c.o;
  const double typical = median(figures.step_times);
  const double exposed = median(figures.exposed_comm_times), optimizer = median(figures.optimizer_times);
  std::cout << "\n== summary ==\n"
            << "final loss        " << std::fixed << std::setprecision(4) << figures.final_loss << " after "
            << (figures.preempted_after ? figures.preempted_after : o.steps) << " steps"
            << (c.train_step.scaler() ? " (" + std::to_string(figures.skipped_steps) + " skipped on overflow)" : "")
            << "\n";
  if (figures.final_val_loss) {
    std::cout << "validation loss   " << std::setprecision(4) << *figures.final_val_loss;
    if (figures.final_val_bpb) std::cout << " = " << std::setprecision(3) << *figures.final_val_bpb << " bits/byte";
    std::cout << " (" << (c.run.conversations ? "the answer tokens of up to " : "") << figures.eval_sequences
              << " held-out " << (c.run.conversations ? "rows" : "sequences") << ")\n";
  }
  if (c.run.conversations) {
    const fsdp::models::ConversationData& data = *c.run.conversations;
    std::cout << "conversations     " << figures.answer_tokens << " answer tokens trained; rows "
              << std::setprecision(1) << 100.0 * data.packing_efficiency() << "% full ("
              << (c.o.pack ? "packed" : "one a row") << "); " << data.truncated() << " cut to --context + 1, "
              << data.skipped() << " without an answer token\n";
  }
  std::cout << "throughput        " << std::setprecision(0) << c.predicted.tokens_per_step / typical
            << " tokens/s (median step " << std::setprecision(3) << typical << " s, first step excluded); wall "
            << std::setprecision(1) << figures.elapsed << " s\n"
            << "step time split   (rank 0, medians) compute " << std::setprecision(3) << typical - exposed - optimizer
            << " s, exposed communication " << exposed << " s (" << std::setprecision(1) << 100.0 * exposed / typical
            << "%), optimizer " << std::setprecision(3) << optimizer << " s\n";
  if (c.nvme.on) {
    const double wait = median(figures.offload_wait_times);
    std::cout << "disk offload      (rank 0, medians) " << format_mib(static_cast<int64_t>(median(figures.offload_read)))
              << " read and " << format_mib(static_cast<int64_t>(median(figures.offload_written)))
              << " written per step (the planner: " << format_mib(c.predicted.nvme->io_per_step())
              << " in all); compute waited " << std::setprecision(3) << wait << " s (" << std::setprecision(1)
              << 100.0 * wait / typical << "%) on it; its I/O thread copied for " << std::setprecision(3)
              << median(figures.offload_copy_times) << " s, checksummed for " << median(figures.offload_checksum_times)
              << " s and waited on the disk for " << median(figures.offload_disk_times) << " s; read "
              << figures.offload_last_read_ahead << " unit(s) ahead in the last step (" << figures.offload_first_read_ahead
              << " in the first, at most " << c.run.fsdp_options.offload().nvme_options()->max_read_ahead() << ")\n";
  }
}

// Rank 0's bytes of the last step, by kind and by where they went, beside the planner's.
void print_comm(const ReportContext& c, const RunFigures& figures) {
  const fsdp::CommBytes& plan = c.predicted.comm;
  const int64_t total = total_bytes(figures.last_comm), cross_host = total_bytes(figures.last_cross_host_comm);
  std::cout << "communication     (rank 0, last step, bytes)";
  for (auto kind : kStepKinds) {
    std::cout << " " << fsdp::enum_name(kind) << " " << figures.last_comm.bytes[static_cast<size_t>(kind)];
  }
  std::cout << "\n                  across hosts " << cross_host << " (planned " << plan.cross_host
            << "), inside a host " << total - cross_host << " (planned " << plan.inside_host() << "); hosts of "
            << c.predicted.ranks_per_node << " rank(s)\n";
}

// Per-rank tensor memory against the planner's, and the resident sets.
void print_host_memory(const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  const int W = c.world_size;
  const Predictions& p = c.predicted;
  std::cout << "per-rank memory   (exact tensor bytes from the counting allocator)\n";
  for (int r = 0; r < W; ++r) {
    const fsdp::RankFigures& f = figures.last_figures[r];
    std::cout << "  rank " << r << ": model state " << format_mib(f.model_state_bytes) << " (params "
              << format_mib(f.param_shard_bytes) << ", grads " << format_mib(f.grad_shard_bytes) << ", optimizer "
              << format_mib(f.optimizer_state_bytes) << "), peak tensors " << format_mib(figures.max_peak[r]) << "\n";
  }
  std::cout << "  the planner predicted a peak of " << format_mib(p.peak_bytes)
            << (c.nvme.on ? " with the offload (in memory: " : " (") << "model state "
            << format_mib(p.nvme ? p.nvme->resident.total() : p.peak.state.total()) << ", gathered "
            << format_mib(p.peak.gathered) << ", activations " << format_mib(p.peak.activations)
            << ", backward transient " << format_mib(p.peak.backward_transient)
            << (p.peak.secondary_partition > 0 ? ", secondary partition " + format_mib(p.peak.secondary_partition) : "")
            << ")\n";
  const fsdp::memory::Usage& usage = figures.last_usage;
  std::cout << "  rank 0's last step, each category's peak:";
  for (size_t k = 0; k < fsdp::memory::kNumCategories; ++k) {
    const auto category = static_cast<fsdp::memory::Category>(k);
    std::cout << (k ? ", " : " ") << fsdp::enum_name(category) << " " << format_mib(usage.peak(category));
  }
  std::cout << "\n";
  std::cout << "  full model state on one process would be " << format_mib(16 * p.num_params)
            << " (16 bytes x parameters)\n";
  const int64_t rss_sum = std::accumulate(end.rss.begin(), end.rss.end(), int64_t{0});
  std::cout << "  peak RSS of all ranks " << format_mib(rss_sum);
  if (c.run.ram_predicted > 0) {
    std::cout << "; the preflight planned " << format_mib(c.run.ram_predicted_all_ranks) << " ("
              << format_mib(c.run.ram_predicted) << " a rank";
    const int64_t extra = c.run.ram_predicted_all_ranks - c.run.ram_predicted * W;  // MPI's buffers, rank 0's staging
    if (extra > 0) std::cout << ", " << format_mib(extra) << " more on the shard groups' first ranks";
    std::cout << ")";
  }
  std::cout << "\n";
}

// A GPU run's device memory, per rank and over the run.
void print_device_memory(const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  if (c.run.device.is_cpu()) return;
  std::cout << "device memory     (" << c.run.device << ", the CUDA caching allocator; " << c.run.backend
            << " collectives" << (c.o.offload == "cpu" ? ", CPU offload" : "") << ")\n";
  for (int r = 0; r < c.world_size; ++r) {
    const fsdp::RankFigures& f = figures.last_figures[r];
    std::cout << "  rank " << r << ": last step's peak " << format_mib(f.device_peak_bytes)
              << ", of which gathered parameters at most " << format_mib(f.device_gathered_peak_bytes)
              << "; model state there " << format_mib(f.device_model_state_bytes) << " (params "
              << format_mib(f.device_param_shard_bytes) << ", grads " << format_mib(f.device_grad_shard_bytes)
              << ", optimizer " << format_mib(f.device_optimizer_state_bytes) << ")\n";
  }
  std::cout << "  run's peak " << format_mib(end.peak_device) << " allocated, " << format_mib(end.peak_device_reserved)
            << " reserved (largest rank)\n";
}

// --save-final's file, and the preemption's line.
void print_outputs(const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  const TrainOptions& o = c.o;
  if (!o.save_final.empty()) {
    const std::string file = o.save_format == "peft" ? o.save_final + "/adapter_model.safetensors" : o.save_final;
    const double mb = (o.save_format == "hf" ? fsdp::hugging_face::find_model(o.save_final).weight_bytes()
                                             : static_cast<int64_t>(std::filesystem::file_size(file))) / 1e6;
    std::cout << "saved final weights to " << o.save_final << " (" << std::setprecision(1) << mb << " MB in "
              << std::setprecision(2) << end.save_final_s << " s, " << std::setprecision(0) << mb / end.save_final_s
              << " MB/s; rank 0's tensor memory peaked " << format_mib(end.save_final_peak_extra)
              << " above its model state while saving)\n";
  }
  if (figures.preempted_after) {
    const int64_t after = figures.preempted_after;
    std::cout << "preempted         a signal (SIGTERM or SIGUSR1) reached "
              << (figures.signalled_here ? "this rank" : "a rank") << "; stopped after step " << after
              << (o.ckpt_dir.empty() ? ", nothing saved (no --ckpt-dir)"
                                     : ", checkpoint " +
                                           (std::filesystem::path(o.ckpt_dir) / ("step-" + std::to_string(after))).string() +
                                           " saved: resume with --resume")
              << "; exit status " << (o.ckpt_dir.empty() ? fsdp_tools::kExitPreemptedUnsaved : fsdp_tools::kExitPreempted) << "\n";
  }
}

}  // namespace

void print_summary(const ReportContext& c, const RunFigures& figures, const EndFigures& end) {
  print_training(c, figures);
  print_comm(c, figures);
  print_host_memory(c, figures, end);
  print_device_memory(c, figures, end);
  print_outputs(c, figures, end);
  std::cout << std::flush;
}

}  // namespace fsdp_train
