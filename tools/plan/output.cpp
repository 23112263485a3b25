// fsdp-plan's outputs: the report as one JSON object (--json; its fields:
// README.md) and as text tables (the strategies' memory and communication,
// the hosts, the disk offload, the checkpoint staging, the textbook
// accounting, the --budget recommendation, the cluster's step times).

#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "plan/estimates.h"
#include "fsdp/options.h"
#include "fsdp/run_plan.h"
#include "plan/plan.h"
#include "models/attention_kernel.h"

namespace fsdp_plan {
namespace {

std::string gib(double bytes) {
  std::ostringstream s;
  if (bytes >= 1e9 * 1.073741824) {
    s << std::fixed << std::setprecision(bytes >= 1e11 ? 0 : 1) << bytes / 1073741824.0 << " GiB";
  } else {
    s << std::fixed << std::setprecision(1) << bytes / 1048576.0 << " MiB";
  }
  return s.str();
}

nlohmann::json nvme_json(const Plan& plan, const std::optional<double>& io_s) {
  if (!plan.run.nvme) return nullptr;
  const fsdp::NvmeOffloadPlan& n = *plan.run.nvme;
  return {{"ram_peak_bytes", plan.run.step_peak},
          {"resident_model_state_bytes", n.resident.total()},
          {"offloaded_bytes", n.offloaded},
          {"file_bytes", n.file_bytes},
          {"read_bytes_per_step", n.read_per_step},
          {"written_bytes_per_step", n.written_per_step},
          {"io_s_per_step", io_s ? nlohmann::json(*io_s) : nlohmann::json(nullptr)}};
}

nlohmann::json comm_json(const fsdp::CommBytes& comm) {
  return {{"all_gather", comm.all_gather},   {"reduce_scatter", comm.reduce_scatter},
          {"all_reduce", comm.all_reduce},   {"all_to_all", comm.all_to_all},
          {"cross_host", comm.cross_host},   {"inside_host", comm.inside_host()},
          {"total", comm.total()}};
}

nlohmann::json plan_json(const Plan& plan) {
  const auto& st = plan.run.peak.state;
  return {{"strategy", fsdp::enum_name(plan.run.strategy)},
          {"shard_group_size", plan.run.shard_group},
          {"params_bytes", st.params},
          {"frozen_params_bytes", st.frozen_params},
          {"grads_bytes", st.grads},
          {"optimizer_bytes", st.optimizer},
          {"model_state_bytes", st.total()},
          {"needed_bytes", st.total_with_gathered()},
          {"gathered_bytes", plan.run.peak.gathered},
          {"activations_bytes", plan.run.peak.activations},
          {"backward_transient_bytes", plan.run.peak.backward_transient},
          {"secondary_partition_bytes", plan.run.peak.secondary_partition},
          {"quantized_gather_buffer_bytes", plan.quantized_gather_buffers},
          {"step_peak_bytes", plan.run.peak.total()},
          {"device_total_bytes", plan.device()},
          {"host_bytes", plan.host},
          {"preflight_bytes", plan.preflight},
          {"comm_bytes", comm_json(plan.run.comm)},
          {"checkpoint_staging", plan.staging ? nlohmann::json({{"rank0_bytes", plan.staging->rank0},
                                                                 {"per_rank_bytes", plan.staging->per_rank}})
                                              : nlohmann::json(nullptr)}};
}

nlohmann::json recommendation_json(const Recommendation& r) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& c : r.candidates) {
    candidates.push_back({{"strategy", fsdp::enum_name(c.strategy)},
                          {"needed_bytes", c.needed()},
                          {"fits", c.needed() <= r.budget},
                          {"comm_bytes", c.comm.total()}});
  }
  return {{"budget_bytes", r.budget},
          {"strategy", r.choice ? nlohmann::json(fsdp::enum_name(r.choice->strategy)) : nlohmann::json(nullptr)},
          {"reason", r.reason},
          {"candidates", candidates}};
}

// The textbook table (bf16 parameters and gradients, replicated or divided
// by the world): a shortcut counts 4 B of optimizer state per parameter;
// Adam with fp32 master weights needs 12 (master, two moments). Calls
// row(layout is sharded, optimizer bytes per parameter, divisor).
template <class Row>
void for_each_seed_accounting_row(int world, Row row) {
  for (int sharded = 0; sharded < 2; ++sharded) {
    for (double optimizer_bytes : {4.0, 12.0}) row(sharded != 0, optimizer_bytes, sharded ? world : 1.0);
  }
}

nlohmann::json inputs_json(const Report& r) {
  const PlanInputs& in = r.in;
  const fsdp::TransformerShape& shape = r.model.shape;
  const nlohmann::json null_json(nullptr);
  return {{"model", in.model},
          {"preset", in.preset.empty() ? null_json : nlohmann::json(in.preset)},
          {"init_from", in.init_from.empty() ? null_json : nlohmann::json(in.init_from)},
          {"params", in.params > 0 ? nlohmann::json(in.params) : null_json},
          {"layers", shape.layers},
          {"width", shape.width},
          {"vocab", shape.vocab},
          {"context", shape.context},
          {"heads", shape.heads},
          {"batch", shape.batch},
          {"world", in.world},
          {"nodes", in.nodes},
          {"ranks_per_node", r.per_node},
          {"strategy", in.strategy},
          {"param_dtype", fsdp::enum_name(r.mp.param_dtype())},
          {"reduce_dtype", fsdp::enum_name(r.mp.effective_reduce_dtype())},
          {"activation_checkpointing", in.activation_checkpointing},
          {"wrap", in.wrap},
          {"prefetch", in.prefetch},
          {"offload", in.offload},
          {"ckpt_async", in.ckpt_async},
          {"gather_quantization", in.gather_quantization},
          {"secondary_partition", in.secondary_partition},
          {"gradient_quantization", in.gradient_quantization},
          {"quantization_block", in.quantization_block},
          {"budget_bytes", r.recommendation ? nlohmann::json(r.recommendation->budget) : null_json},
          {"cluster", r.cluster ? nlohmann::json(in.cluster_path) : null_json}};
}

nlohmann::json cluster_json(const Report& r) {
  if (!r.cluster) return nullptr;
  nlohmann::json times = nlohmann::json::array();
  for (const auto& plan : r.plans) {
    const fsdp::StepTime t = r.time_of(plan);
    times.push_back({{"strategy", fsdp::enum_name(plan.run.strategy)},
                     {"comm_s", t.comm},
                     {"step_s", t.step},
                     {"scaling_efficiency", t.efficiency}});
  }
  const bool measured = r.cluster->collectives.has_value();
  return {{"flops", r.cluster->flops},
          {"compute_s", r.compute},
          {"model", measured ? "measured collectives: compute + comm - overlap * min(compute, comm in flight)"
                             : "ring: max(compute, comm) + the first gather"},
          {"overlap", measured ? nlohmann::json(r.cluster->collectives->overlap) : nlohmann::json(nullptr)},
          {"strategies", times}};
}

// --freeze or LoRA as asked, and what they did (null without them).
nlohmann::json fine_tuning_json(const Report& r) {
  if (!r.in.fine_tuning()) return nullptr;
  const nlohmann::json null_json(nullptr);
  return {{"freeze", r.in.freeze.empty() ? null_json : nlohmann::json(r.in.freeze)},
          {"lora_rank", r.in.lora() ? nlohmann::json(r.in.lora_rank) : null_json},
          {"lora_targets", r.in.lora() ? nlohmann::json(r.in.lora_targets) : null_json},
          {"lora_adapted", r.model.fine_tuned.adapted}};
}

}  // namespace

void print_json(const Report& r) {
  nlohmann::json out;
  out["inputs"] = inputs_json(r);
  out["model"] = {{"config", r.model.described.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.model.described)},
                  {"parameters", r.model.total_params},
                  {"trainable_parameters", r.model.trainable_params},
                  {"unit_numels", r.model.units},
                  {"frozen_unit_numels", r.model.frozen},
                  {"fine_tuning", fine_tuning_json(r)},
                  {"largest_unit_numel", r.model.largest_unit},
                  {"attention", fsdp::enum_name(fsdp::resolve_attention(r.in.attention_kernel()))}};
  out["strategies"] = nlohmann::json::array();
  for (const auto& plan : r.plans) {
    out["strategies"].push_back(plan_json(plan));
    out["strategies"].back()["nvme"] = nvme_json(plan, r.io_seconds(plan));
  }
  out["recommendation"] = r.recommendation ? recommendation_json(*r.recommendation) : nlohmann::json(nullptr);
  out["cluster"] = cluster_json(r);
  if (r.in.seed_accounting) {  // the textbook table, in bytes
    const double N = static_cast<double>(r.model.total_params);
    out["seed_accounting"] = nlohmann::json::array();
    for_each_seed_accounting_row(r.in.world, [&](bool sharded, double optimizer_bytes, double d) {
      out["seed_accounting"].push_back({{"layout", sharded ? "fsdp" : "ddp"},
                                        {"optimizer_bytes_per_param", optimizer_bytes},
                                        {"params_bytes", 2 * N / d},
                                        {"grads_bytes", 2 * N / d},
                                        {"optimizer_bytes", optimizer_bytes * N / d},
                                        {"total_bytes", (4 + optimizer_bytes) * N / d}});
    });
  }
  std::cout << out.dump(2) << "\n";
}

namespace {

void print_strategy_table(const Report& r) {
  const fsdp::TransformerShape& shape = r.model.shape;
  std::cout << "model: " << r.model.total_params << " parameters in " << r.model.units.size() << " units ("
            << shape.layers << " blocks, " << r.in.wrap << " units, the largest " << r.model.largest_unit
            << "); vocab " << shape.vocab << ", context " << shape.context << ", width " << shape.width << ", heads "
            << shape.heads << ", batch " << shape.batch << " per rank\n";
  if (!r.in.init_from.empty()) std::cout << "from " << r.in.init_from << ": " << r.model.described << "\n";
  std::cout << "world: " << r.in.world << " ranks on " << r.in.nodes << " node(s); params "
            << fsdp::enum_name(r.mp.param_dtype()) << ", reduce " << fsdp::enum_name(r.mp.effective_reduce_dtype())
            << (r.mp.frozen_param_dtype() ? std::string(", frozen base ") + fsdp::enum_name(*r.mp.frozen_param_dtype()) : "")
            << "; prefetch " << (r.in.prefetch ? "on" : "off") << "; activation checkpointing "
            << (r.in.activation_checkpointing ? "on" : "off") << "; offload " << r.in.offload << "\n"
            << "per rank (AdamW: fp32 master + two fp32 moments = 12 B per parameter, sharded as the strategy says):\n";
  const char* columns[] = {"strategy", "params", "grads", "optimizer", "gathered", "activations", "bwd transient",
                           "device total", "host (offload)", "comm / step"};
  std::cout << std::left << std::setw(20) << columns[0];
  for (int i = 1; i < 10; ++i) std::cout << std::right << std::setw(i >= 5 ? 15 : 12) << columns[i];
  std::cout << "\n";
  for (const auto& plan : r.plans) {
    const auto& st = plan.run.peak.state;
    std::cout << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << std::right << std::setw(12)
              << gib(st.params) << std::setw(12) << gib(st.grads) << std::setw(12) << gib(st.optimizer)
              << std::setw(12) << gib(plan.run.peak.gathered) << std::setw(15) << gib(plan.run.peak.activations)
              << std::setw(15) << gib(plan.run.peak.backward_transient) << std::setw(15) << gib(plan.device())
              << std::setw(15) << gib(plan.host) << std::setw(15) << gib(plan.run.comm.total()) << "\n";
  }
}

// What trains, and the model state by category with the frozen parameters'
// bytes apart (--trainable, --freeze, --lora-rank).
void print_trainable(const Report& r) {
  const PlanInputs& in = r.in;
  std::ostringstream how;
  if (in.lora()) {
    how << "LoRA rank " << in.lora_rank << ": " << r.model.fine_tuned.adapted.size() << " linears adapted, the rest frozen";
  } else if (!in.freeze.empty()) {
    how << "--freeze '" << in.freeze << "'";
  } else {
    how << "nothing frozen";
  }
  std::cout << "trainable " << r.model.trainable_params << " of " << r.model.total_params << " parameters (" << how.str()
            << ")\nmodel state per rank by category (a unit's frozen parameters are a flat buffer of their own, "
               "gathered with it: a parameter shard, no gradient, no optimizer state, no reduction):\n";
  const char* columns[] = {"strategy", "trainable params", "frozen params", "grads", "optimizer", "model state"};
  std::cout << "  " << std::left << std::setw(20) << columns[0];
  for (int i = 1; i < 6; ++i) std::cout << std::right << std::setw(18) << columns[i];
  std::cout << "\n";
  for (const auto& plan : r.plans) {
    const auto& st = plan.run.peak.state;
    std::cout << "  " << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << std::right
              << std::setw(18) << gib(st.params - st.frozen_params) << std::setw(18) << gib(st.frozen_params)
              << std::setw(18) << gib(st.grads) << std::setw(18) << gib(st.optimizer) << std::setw(18)
              << gib(st.total()) << "\n";
  }
}

void print_nvme_table(const Report& r) {
  std::cout << "with nvme offload ("
            << (r.in.offload == "nvme" ? "optimizer state and, where sharded, parameters" : "optimizer state")
            << " on disk), per rank: tensor bytes in host memory (the runtime's ~256 MiB come on top) and on disk"
            << (r.disk_measured ? "" : " (I/O time: give --cluster with fsdp-plan calibrate --offload-dir's disk figures)")
            << ":\n";
  const char* columns[] = {"strategy", "RAM peak", "in memory", "on disk", "scratch file", "read / step",
                           "written / step", "I/O / step"};
  std::cout << std::left << std::setw(20) << columns[0];
  for (int i = 1; i < 8; ++i) std::cout << std::right << std::setw(15) << columns[i];
  std::cout << "\n";
  for (const auto& plan : r.plans) {
    const fsdp::NvmeOffloadPlan& n = *plan.run.nvme;
    const std::optional<double> io = r.io_seconds(plan);
    std::ostringstream io_text;
    if (io) io_text << std::fixed << std::setprecision(2) << *io << " s";
    std::cout << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << std::right << std::setw(15)
              << gib(plan.run.step_peak) << std::setw(15) << gib(n.resident.total()) << std::setw(15) << gib(n.offloaded)
              << std::setw(15) << gib(n.file_bytes) << std::setw(15) << gib(n.read_per_step) << std::setw(15)
              << gib(n.written_per_step) << std::setw(15) << (io ? io_text.str() : "-") << "\n";
  }
}

void print_seed_accounting(const Report& r) {
  const double N = static_cast<double>(r.model.total_params), gb = 1e9;
  std::cout << "textbook accounting, per device (GB = 1e9 B; bf16 params and grads):\n"
            << "  layout                         params    grads  optimizer    total\n";
  for_each_seed_accounting_row(r.in.world, [&](bool sharded, double optimizer_bytes, double d) {
    std::ostringstream name;
    name << (sharded ? "FSDP / " + std::to_string(r.in.world) : std::string("DDP")) << ", optimizer "
         << optimizer_bytes << " B/param";
    std::cout << "  " << std::left << std::setw(30) << name.str() << std::right << std::fixed << std::setprecision(1)
              << std::setw(9) << 2 * N / d / gb << std::setw(9) << 2 * N / d / gb << std::setw(11)
              << optimizer_bytes * N / d / gb << std::setw(9) << (4 + optimizer_bytes) * N / d / gb << "\n"
              << std::defaultfloat;
  });
  std::cout << "  (this project keeps fp32 gradient shards and a separate fp32 master, as the table above shows)\n";
}

void print_recommendation(const Report& r) {
  // The same text fsdp-train --strategy auto prints.
  std::cout << "--budget (" << gib(r.recommendation->budget) << " per rank): " << r.recommendation->reason << "\n";
  if (!r.recommendation->choice) return;
  const fsdp::RunPlan chosen =
      fsdp::plan_run({r.model.description, plan_options(r, r.recommendation->choice->strategy, false), plan_settings(r)});
  std::cout << "  (on top of the budget: prefetch's unit ahead, activations and backward's buffers; "
            << fsdp::enum_name(r.recommendation->choice->strategy) << "'s step peak is " << gib(chosen.peak.total())
            << ")\n";
}

void print_cluster_times(const Report& r) {
  std::cout << "step time per rank on the cluster (compute " << std::setprecision(3) << r.compute
            << " s; communication overlapped with it, except the first unit's gather):\n";
  for (const auto& plan : r.plans) {
    const fsdp::StepTime t = r.time_of(plan);
    std::cout << "  " << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << " comm "
              << std::setprecision(3) << t.comm << " s, step " << t.step << " s, scaling efficiency "
              << std::setprecision(0) << std::fixed << 100.0 * t.efficiency << "%\n"
              << std::defaultfloat;
  }
}

// Where a step's bytes go (across hosts or inside one) and what ZeRO++'s
// options cost in memory, per strategy.
void print_hosts_table(const Report& r) {
  const fsdp::ZeroPlusPlus z = r.in.zero_plus_plus();
  std::cout << "across " << r.in.nodes << " host(s), per rank and step (ZeRO++: gather quantization "
            << fsdp::enum_name(z.gather_quantization()) << ", secondary partition "
            << (z.secondary_partition() ? "on" : "off") << ", gradient quantization "
            << fsdp::enum_name(z.gradient_quantization()) << ", blocks of " << z.quantization_block()
            << "):\n";
  for (const auto& plan : r.plans) {
    std::cout << "  " << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << std::right
              << " across hosts " << plan.run.comm.cross_host << " B, inside a host " << plan.run.comm.inside_host()
              << " B; secondary partition " << gib(plan.run.peak.secondary_partition) << ", quantized gather buffers "
              << gib(plan.quantized_gather_buffers) << "\n";
  }
}

// --ckpt-async: each strategy's staging copy (CheckpointStaging).
void print_staging(const Report& r) {
  std::cout << "with --ckpt-async (" << r.in.ckpt_async << " format), host memory a save's staging copy holds beside "
            << "the steps until its background write ends:\n";
  for (const auto& plan : r.plans) {
    std::cout << "  " << std::left << std::setw(20) << fsdp::enum_name(plan.run.strategy) << std::right << " rank 0 "
              << gib(plan.staging->rank0) << ", each other rank " << gib(plan.staging->per_rank) << "\n";
  }
}

}  // namespace

void print_text(const Report& r) {
  print_strategy_table(r);
  if (r.in.trainable || r.in.fine_tuning()) print_trainable(r);
  if (r.in.nodes > 1 || r.in.zero_plus_plus().any()) print_hosts_table(r);
  if (r.in.offload.rfind("nvme", 0) == 0) print_nvme_table(r);
  if (r.in.ckpt_async != "none") print_staging(r);
  std::cout << "  (model state in bytes, as a run of fsdp-train measures it:";
  for (const auto& plan : r.plans) std::cout << " " << fsdp::enum_name(plan.run.strategy) << " " << plan.run.peak.state.total();
  std::cout << ")\n";
  if (r.in.seed_accounting) print_seed_accounting(r);
  if (r.recommendation) print_recommendation(r);
  if (r.cluster) print_cluster_times(r);
}

}  // namespace fsdp_plan
