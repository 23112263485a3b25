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
//   build/fsdp-run -n 2 -- build/fsdp-plan calibrate > cluster.json

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "fsdp/gpt.h"
#include "fsdp/host_memory.h"
#include "offload/disk_store.h"
#include "fsdp/memory_plan.h"
#include "fsdp/run_plan.h"
#include "fsdp/train_step.h"
#include "shared_flags.h"
#include "tool_support.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string gib(double bytes) {
  std::ostringstream s;
  if (bytes >= 1e9 * 1.073741824) {
    s << std::fixed << std::setprecision(bytes >= 1e11 ? 0 : 1) << bytes / 1073741824.0 << " GiB";
  } else {
    s << std::fixed << std::setprecision(1) << bytes / 1048576.0 << " MiB";
  }
  return s.str();
}

// A cluster: the step-time model's description (fsdp::ClusterDescription:
// each device's FLOP/s, per-link bandwidth and latency inside a node and
// across nodes, the collectives measured), and what else calibrate measures.
struct Cluster : fsdp::ClusterDescription {
  // fsdp-plan calibrate --offload-dir: the host's disk, all its ranks at once (bytes/s; 0: not measured).
  double disk_read_bandwidth = 0, disk_write_bandwidth = 0;
  // fsdp-plan calibrate --preset: one forward and backward of that preset's model, all ranks at once.
  std::string model_step_preset;
  double model_step_s = 0;
  void load_measured(const nlohmann::json& j) {
    if (j.contains("model_step")) {
      model_step_preset = j["model_step"].at("preset").get<std::string>();
      model_step_s = j["model_step"].at("forward_backward_s").get<double>();
    }
    if (!j.contains("collectives")) return;
    const auto& c = j["collectives"];
    const auto& r = c.at("bytes_per_s");
    collectives = MeasuredCollectives{c.at("world").get<int>(), c.at("ranks_per_node").get<int>(),
                              r.at("all_gather_world").get<double>(), r.at("all_gather_world_int8").get<double>(),
                              r.at("reduce_scatter_world").get<double>(), r.at("all_gather_host").get<double>(),
                              r.at("reduce_scatter_host").get<double>(), r.at("all_reduce_cross_host").get<double>(),
                              r.at("all_to_all_cross_host").get<double>(), c.value("overlap", 0.0)};
  }
  static Cluster load(const std::string& path) {
    fsdp_tools::require_regular_file(path, "the cluster description");
    std::ifstream in(path);
    TORCH_CHECK(in, "cannot open the cluster description '", path, "'");
    nlohmann::json j;
    try {
      in >> j;
      Cluster c;
      c.flops = j.at("flops").get<double>();
      c.intra_bandwidth = j.at("intra_node_bandwidth").get<double>();
      c.intra_latency = j.at("intra_node_latency").get<double>();
      c.inter_bandwidth = j.at("inter_node_bandwidth").get<double>();
      c.inter_latency = j.at("inter_node_latency").get<double>();
      TORCH_CHECK(c.flops > 0 && c.intra_bandwidth > 0 && c.inter_bandwidth > 0, "values must be positive");
      c.disk_read_bandwidth = j.value("disk_read_bandwidth", 0.0);
      c.disk_write_bandwidth = j.value("disk_write_bandwidth", 0.0);
      c.load_measured(j);
      return c;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "'", path, "': expected {flops, intra_node_bandwidth, intra_node_latency, ",
                  "inter_node_bandwidth, inter_node_latency}: ", fsdp::error_message(e));
    }
  }
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
  return {{"strategy", fsdp::strategy_name(plan.run.strategy)},
          {"shard_group_size", plan.run.shard_group},
          {"params_bytes", st.params},
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

// --budget: fsdp::choose_strategy's answer, or why nothing fits.
struct Recommendation {
  int64_t budget = 0;
  std::optional<fsdp::StrategyChoice> choice;
  std::vector<fsdp::StrategyCandidate> candidates;
  std::string reason;  // choice->reason, or the error naming every candidate's need
};

Recommendation recommend(const std::vector<int64_t>& units, int world, int per_node, const fsdp::MixedPrecision& mp,
                         int64_t budget) {
  Recommendation r;
  r.budget = budget;
  r.candidates = fsdp::strategy_candidates(units, world, per_node, mp);
  try {
    r.choice = fsdp::choose_strategy(units, world, per_node, mp, budget);
    r.reason = r.choice->reason;
  } catch (const c10::Error& e) {  // nothing fits: an answer too, not a failure of the planner
    r.reason = fsdp::error_message(e);
  }
  return r;
}

nlohmann::json recommendation_json(const Recommendation& r) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& c : r.candidates) {
    candidates.push_back({{"strategy", fsdp::strategy_name(c.strategy)},
                          {"needed_bytes", c.needed()},
                          {"fits", c.needed() <= r.budget},
                          {"comm_bytes", c.comm.total()}});
  }
  return {{"budget_bytes", r.budget},
          {"strategy", r.choice ? nlohmann::json(fsdp::strategy_name(r.choice->strategy)) : nlohmann::json(nullptr)},
          {"reason", r.reason},
          {"candidates", candidates}};
}

// Each rank writes `bytes` into a scratch store in `dir` and reads them
// back, all ranks at once as offloading ranks would, through the engine
// training would get there. Bytes per second of the whole host.
struct DiskBandwidth {
  double write = 0, read = 0;
  std::string engine;
};
DiskBandwidth measure_disk(fsdp::ProcessGroup& world, const std::string& dir, int64_t bytes) {
  const int64_t slot = int64_t{64} << 20;
  const int64_t slots = std::max<int64_t>(1, bytes / slot);
  fsdp::offload::DiskStore store(
      fsdp::offload::DiskStoreOptions(dir).name("calibrate-rank" + std::to_string(world.rank())),
      std::vector<int64_t>(slots, slot));
  std::vector<char> data(slot, 1);
  auto timed = [&](bool write) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    std::vector<std::shared_future<void>> pending;
    for (int64_t i = 0; i < slots; ++i) pending.push_back(write ? store.write(i, data.data()) : store.read(i, data.data()));
    for (auto& p : pending) p.get();
    world.barrier()->wait();  // the host's bandwidth: until the slowest rank is done
    return static_cast<double>(slot * slots * world.size()) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  DiskBandwidth result;
  result.write = timed(true);
  result.read = timed(false);
  result.engine = store.engine_description();
  return result;
}

// One forward and backward of the preset's whole model (its per-rank
// batch) on this rank, no sharding: the compute a step needs on these
// cores, attention, norms and the sharing of oversubscribed cores included
// (GEMM FLOP/s alone put it ~2x low).
struct ModelStep {
  explicit ModelStep(const std::string& preset) : config(fsdp::models::GPTConfig::preset(preset)), model(config) {
    model->init_weights(0);
    idx = torch::randint(config.vocab, {config.batch, config.context}, torch::kLong);
    targets = torch::randint(config.vocab, {config.batch, config.context}, torch::kLong);
    run();  // warm-up: the allocator's blocks, the threads
  }
  void run() {
    model->zero_grad();
    model->forward(idx, targets).backward();
  }
  // Seconds of `reps` runs, every rank at once.
  double timed(fsdp::ProcessGroup& world, int reps) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) run();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    world.barrier()->wait();
    return seconds;
  }
  fsdp::models::GPTConfig config;
  fsdp::models::GPT model;
  torch::Tensor idx, targets;
};

// Counted bytes per second of `call` (a collective moving `counted` bytes as
// the communicator counts them), all ranks at once: the rate the step-time
// model divides each collective's counted bytes by. It carries everything
// the counters leave out: the algorithm OpenMPI picks for this size (which
// ranks pair across hosts, how often a byte crosses), TCP's efficiency
// under the cap, and both ranks of a host sharing its link.
template <class Call>
double counted_rate(fsdp::ProcessGroup& world, int64_t counted, int reps, Call call) {
  call();
  world.barrier()->wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) call();
  world.barrier()->wait();  // until the slowest rank is done
  return static_cast<double>(counted) * reps / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The rates of the collectives a step runs, with hosts of `per_node` ranks,
// at the sizes of a unit of `unit_numel` elements (fp32): the world's
// gathers and reduce-scatters (full_shard; int8 packed for qwZ), the host
// group's (hpZ, qgZ's first step, the hybrids), the cross-host group's
// all-reduce (the hybrids' shard) and all-to-all (qgZ's packed gradient).
nlohmann::json measure_collectives(const fsdp::ProcessGroupPtr& world, int per_node, int64_t unit_numel, int reps,
                                   int64_t block) {
  const int W = world->size(), rank = world->rank();
  TORCH_CHECK(per_node > 0 && W % per_node == 0, "calibrate: --ranks-per-node must divide the world (", W, "), got ",
              per_node);
  const int64_t H = W / per_node;
  auto host = world->split(rank / per_node, rank);
  auto cross = world->split(rank % per_node, rank);
  const int64_t S = (unit_numel + W - 1) / W, Np = S * W;
  const int64_t Sh = (unit_numel + per_node - 1) / per_node;  // a hybrid's shard
  const int64_t nb = (S + block - 1) / block, packed = nb * block + 4 * nb;
  auto f32 = [](int64_t n) { return torch::ones({n}); };
  auto u8 = [](int64_t n) { return torch::ones({n}, torch::kByte); };
  torch::Tensor gathered = f32(Np), shard = f32(S), host_gathered = f32(Sh * per_node), host_shard = f32(Sh);
  torch::Tensor packed_out = u8(W * packed), packed_in = u8(packed), a2a_in = u8(H * packed), a2a_out = u8(H * packed);
  nlohmann::json rates;
  rates["all_gather_world"] = counted_rate(*world, gathered.nbytes(), reps, [&] { world->all_gather(gathered, shard)->wait(); });
  rates["reduce_scatter_world"] = counted_rate(*world, gathered.nbytes(), reps, [&] {
    world->reduce_scatter(shard, gathered, fsdp::ReduceOp::kSum)->wait();
  });
  rates["all_gather_world_int8"] =
      counted_rate(*world, packed_out.nbytes(), reps, [&] { world->all_gather(packed_out, packed_in)->wait(); });
  rates["all_gather_host"] =
      counted_rate(*world, host_gathered.nbytes(), reps, [&] { host->all_gather(host_gathered, host_shard)->wait(); });
  rates["reduce_scatter_host"] = counted_rate(*world, host_gathered.nbytes(), reps, [&] {
    host->reduce_scatter(host_shard, host_gathered, fsdp::ReduceOp::kSum)->wait();
  });
  rates["all_reduce_cross_host"] =
      counted_rate(*world, host_shard.nbytes(), reps, [&] { cross->all_reduce(host_shard, fsdp::ReduceOp::kSum)->wait(); });
  rates["all_to_all_cross_host"] =
      counted_rate(*world, a2a_in.nbytes(), reps, [&] { cross->all_to_all(a2a_out, a2a_in)->wait(); });
  return {{"world", W}, {"ranks_per_node", per_node}, {"unit_numel", unit_numel}, {"quantization_block", block},
          {"bytes_per_s", rates}};
}

// How much of a collective's time hides behind compute on these cores: the
// model's step run while the world all-gathers the largest unit back to
// back (queued on the group's communication thread, as the engine's
// prefetch does), about as long as the step. 1: the gathers cost nothing
// on top; 0: compute and communication add up (a core's time goes to one
// or the other: TCP copies, OpenMPI's progress, the reductions).
double measure_overlap(fsdp::ProcessGroup& world, ModelStep& step, double step_s, int64_t unit_numel,
                       double gather_rate) {
  const int W = world.size();
  const int64_t S = (unit_numel + W - 1) / W;
  torch::Tensor out = torch::empty({S * W}), in = torch::ones({S});
  const double gather_s = static_cast<double>(out.nbytes()) / gather_rate;
  // The same count on every rank: the mean of their choices.
  torch::Tensor count = torch::tensor({std::clamp(std::round(step_s / gather_s), 1.0, 64.0)}, torch::kDouble);
  world.all_reduce(count, fsdp::ReduceOp::kAvg)->wait();
  const int gathers = static_cast<int>(std::llround(count.item<double>()));
  world.barrier()->wait();
  const auto t0 = Clock::now();
  std::vector<fsdp::WorkHandle> pending;
  for (int i = 0; i < gathers; ++i) pending.push_back(world.all_gather(out, in));
  step.run();
  for (auto& w : pending) w->wait();
  const double both = std::chrono::duration<double>(Clock::now() - t0).count();
  world.barrier()->wait();
  const double comm_s = gathers * gather_s;
  return std::clamp((step_s + comm_s - both) / std::min(step_s, comm_s), 0.0, 1.0);
}

// What `fsdp-plan calibrate` measures beyond FLOP/s and the gather bandwidth.
struct CalibrateOptions {
  std::string disk_dir;
  int64_t disk_bytes = 0;
  std::string preset;    // --preset: the model's step and the collectives at its largest unit
  int ranks_per_node = 0;  // --ranks-per-node: the hosts the collectives run over
  int reps = 3;
};

int calibrate(int* argc, char*** argv, const CalibrateOptions& options) {
  fsdp::MpiEnvironment mpi(argc, argv);
  auto world = mpi.world();
  // FLOP/s of one rank's fp32 GEMMs with the threads fsdp-run gives it.
  const int64_t n = 1024;
  torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::mm(a, b);
  world->barrier()->wait();
  auto start = Clock::now();
  const int reps = 10;
  for (int i = 0; i < reps; ++i) torch::mm(a, b);
  const double flops = 2.0 * n * n * n * reps / std::chrono::duration<double>(Clock::now() - start).count();
  // All-gather bandwidth (64 MiB gathered) and latency (8 bytes), as the ring model reads them.
  const int k = world->size();
  auto time_gather = [&](int64_t elements, int reps_) {
    torch::Tensor out = torch::empty({elements * k}), in = torch::ones({elements});
    world->all_gather(out, in)->wait();
    world->barrier()->wait();
    auto t0 = Clock::now();
    for (int i = 0; i < reps_; ++i) world->all_gather(out, in)->wait();
    return std::chrono::duration<double>(Clock::now() - t0).count() / reps_;
  };
  const double latency_s = k > 1 ? time_gather(2, 50) / (k - 1) : 0.0;
  const double big = static_cast<double>(16 << 20) * k * 4;  // bytes of the gathered buffer
  const double t = time_gather(16 << 20, 3);
  const double bandwidth = k > 1 ? (k - 1.0) / k * big / std::max(t - (k - 1) * latency_s, 1e-9) : 0.0;
  const DiskBandwidth disk =
      options.disk_dir.empty() ? DiskBandwidth{} : measure_disk(*world, options.disk_dir, options.disk_bytes);
  nlohmann::json model_step = nullptr, collectives = nullptr;
  if (!options.preset.empty()) {
    ModelStep step(options.preset);
    const double seconds = step.timed(*world, 2) / 2;
    model_step = {{"preset", options.preset}, {"forward_backward_s", seconds}};
    if (options.ranks_per_node > 0) {
      const auto& c = step.config;
      const fsdp::TransformerShape shape{c.vocab, c.context, c.layers, c.heads, c.width, c.batch};
      const auto numels = shape.unit_numels();
      const int64_t largest = *std::max_element(numels.begin(), numels.end());
      collectives = measure_collectives(world, options.ranks_per_node, largest, options.reps,
                                         fsdp::ZeroPlusPlus().quantization_block());
      collectives["overlap"] =
          measure_overlap(*world, step, seconds, largest, collectives["bytes_per_s"]["all_gather_world"].get<double>());
    }
  }
  if (world->rank() == 0) {
    nlohmann::json j = {{"flops", flops},
                        {"intra_node_bandwidth", bandwidth},
                        {"intra_node_latency", latency_s},
                        {"inter_node_bandwidth", bandwidth},
                        {"inter_node_latency", latency_s},
                        {"measured_with", std::to_string(k) + " ranks, " +
                                              std::to_string(torch::get_num_threads()) + " threads each"}};
    if (disk.write > 0) {
      j["disk_write_bandwidth"] = disk.write;
      j["disk_read_bandwidth"] = disk.read;
      j["disk"] = {{"dir", options.disk_dir}, {"bytes_per_rank", options.disk_bytes}, {"engine", disk.engine}};
    }
    if (!model_step.is_null()) j["model_step"] = model_step;
    if (!collectives.is_null()) j["collectives"] = collectives;
    std::cout << j.dump(2) << "\n";
  }
  return 0;
}

// What fsdp-plan was asked, as its command line gives it; the model's and
// ZeRO++'s flags are fsdp-train's (shared_flags.h).
struct PlanInputs : fsdp_tools::ModelFlags, fsdp_tools::ZeroPlusPlusFlags {
  double params = 0;
  int world = 2, nodes = 1;
  std::string strategy = "all", param_dtype = "fp32", reduce_dtype, cluster_path, offload = "none", wrap = "block";
  std::string ckpt_async = "none";  // fsdp-train --ckpt-async with this --ckpt-format
  // Disk offload's step (fsdp-train's flags of the same names and defaults).
  double clip_grad_norm = 1.0;
  int offload_read_ahead = 2;
  bool offload_step_after_backward = false;
  bool checkpointing = false, prefetch = true, seed_accounting = false, json = false, sharded_init = false;
  double budget = 0;
};

void add_plan_options(CLI::App& app, PlanInputs& in) {
  fsdp_tools::add_model_flags(app, in, " (the model fsdp-train --preset trains); or give --params");
  app.add_option("--params", in.params,
                 "or a reference GPT of this many parameters (with --layers; e.g. 70e9): --width defaults from the "
                 "count, --vocab to 32000, --context to 4096, --heads to width / 128, --batch to 1")
      ->check(fsdp_tools::positive());
  app.add_option("--world", in.world, "ranks")->check(fsdp_tools::positive())->capture_default_str();
  app.add_option("--nodes", in.nodes, "nodes (hybrid strategies shard inside a node)")
      ->check(fsdp_tools::positive())
      ->capture_default_str();
  app.add_option("--strategy", in.strategy, "one strategy, or all")->capture_default_str();
  app.add_option("--param-dtype", in.param_dtype, "fp32, bf16, fp16")->capture_default_str();
  app.add_option("--reduce-dtype", in.reduce_dtype, "default: the param dtype");
  app.add_flag("--activation-checkpointing", in.checkpointing, "recompute units in backward");
  app.add_flag("--sharded-init", in.sharded_init,
               "as fsdp-train's: no whole model built on every rank first (the preflight's construction term)");
  app.add_option("--wrap", in.wrap, "block (a unit per block) or sublayer (per attention and per MLP)")
      ->capture_default_str();
  app.add_flag("!--no-prefetch", in.prefetch, "no unit gathered ahead (default: one)");
  app.add_option("--offload", in.offload,
                 "none; cpu: fp32 masters, gradients and optimizer state in host memory; nvme: the optimizer state "
                 "and (sharded strategies) the parameters on disk, as fsdp-train --offload-optimizer nvme "
                 "--offload-params nvme; nvme-optimizer: the optimizer state only")
      ->capture_default_str();
  app.add_option("--clip-grad-norm", in.clip_grad_norm,
                 "as fsdp-train's (0: off): with --offload nvme, a run that clips steps after backward, with every "
                 "gradient in memory; one that does not steps each unit during backward")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  app.add_option("--offload-read-ahead", in.offload_read_ahead, "as fsdp-train's: parameter shards read ahead (units)")
      ->check(fsdp_tools::non_negative())
      ->capture_default_str();
  app.add_flag("--offload-step-after-backward", in.offload_step_after_backward, "as fsdp-train's");
  app.add_option("--ckpt-async", in.ckpt_async,
                 "none; sharded or full: the host memory of fsdp-train --ckpt-async --ckpt-format FORMAT's staging copy "
                 "(held beside the steps while a save writes in the background)")
      ->capture_default_str();
  app.add_option("--budget", in.budget,
                 "per-rank bytes for model state plus gathered parameters: the strategy fsdp-train --strategy auto "
                 "--memory-budget picks (the first that fits, from least to most communication)")
      ->check(fsdp_tools::positive());
  fsdp_tools::add_zero_plus_plus_flags(app, in);
  app.add_option("--cluster", in.cluster_path, "cluster JSON (fsdp-plan calibrate writes one): estimate step time");
  app.add_flag("--seed-accounting", in.seed_accounting,
               "also print the textbook DDP-versus-FSDP table, with the optimizer state at 4 B per parameter "
               "(the common shortcut) and at Adam's real 12");
  app.add_flag("--json", in.json, "print the whole plan as one JSON object instead (fields: README.md)");
}

void check_inputs(const PlanInputs& in) {
  TORCH_CHECK(in.preset.empty() != (in.params == 0), "give --preset or --params (with --layers), not both");
  fsdp_tools::check_model_flags(in);
  TORCH_CHECK(in.kind() == fsdp::models::ModelKind::kGpt || in.params == 0, "--params plans the reference GPT's blocks; --model ", in.model,
              " needs --preset");
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

// The model planned: its description (the one fsdp-train plans with), and
// the shape and units' element counts of the wrap asked for, root first.
struct PlannedModel {
  fsdp::ModelDescription description;
  fsdp::TransformerShape shape;
  std::vector<int64_t> units;
  int64_t total_params = 0, largest_unit = 0;
};

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

PlannedModel plan_model(const PlanInputs& in) {
  const bool sublayer = in.wrap == "sublayer";
  PlannedModel m;
  if (in.preset.empty()) {
    m.description = describe_by_count(in, sublayer);
  } else {
    m.description = fsdp_tools::model_config(in, fsdp_tools::gpt_config(in)).plan_description();
  }
  m.shape = m.description.shape;
  m.shape.sublayer_units = sublayer;
  m.units = m.description.units(sublayer);
  for (int64_t n : m.units) m.total_params += n;
  m.largest_unit = *std::max_element(m.units.begin() + 1, m.units.end());
  return m;
}

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

// With ZeRO++'s options, "all" means the strategies that accept them; one
// strategy named that refuses them is an error, with fully_shard's reason.
std::vector<fsdp::ShardingStrategy> strategies_asked(const PlanInputs& in) {
  const fsdp::ZeroPlusPlus z = in.zero_plus_plus();
  const int per_node = in.world / in.nodes;
  if (in.strategy != "all") {
    const fsdp::ShardingStrategy s = fsdp::parse_strategy(in.strategy);
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

// fully_shard's options and the run's settings for strategy `s`, as
// fsdp-train sets them from the same flags (the run's plan: fsdp::plan_run).
fsdp::FullyShardOptions plan_options(const Report& r, fsdp::ShardingStrategy s, bool with_zero_plus_plus) {
  auto options = fsdp::FullyShardOptions()
                     .strategy(s)
                     .mixed_precision(r.mp)
                     .backward_prefetch(r.in.prefetch ? fsdp::BackwardPrefetch::kPre : fsdp::BackwardPrefetch::kNone)
                     .activation_checkpointing(r.in.checkpointing)
                     .zero_plus_plus(with_zero_plus_plus ? r.in.zero_plus_plus() : fsdp::ZeroPlusPlus());
  if (r.in.offload.rfind("nvme", 0) == 0) {
    // Parameters go to disk only where the strategy shards them.
    options.nvme_offload(fsdp::NvmeOffloadOptions("")
                             .optimizer_state(true)
                             .params(r.in.offload == "nvme" && !fsdp::keeps_params_unsharded(s))
                             .read_ahead(r.in.offload_read_ahead)
                             .step_in_backward(!r.in.offload_step_after_backward));
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
  return settings;
}

Plan plan_strategy(const Report& r, fsdp::ShardingStrategy s) {
  const bool sublayer = r.in.wrap == "sublayer";
  const fsdp::RunPlan run = fsdp::plan_run(r.model.description, sublayer, plan_options(r, s, true), plan_settings(r));
  Plan plan{run};
  // What the options add to the memory, against the same strategy without them.
  const fsdp::RunPlan plain = fsdp::plan_run(r.model.description, sublayer, plan_options(r, s, false), plan_settings(r));
  plan.quantized_gather_buffers = plan.run.peak.gathered - plain.peak.gathered;
  // Offload keeps fp32 masters, gradient shards and optimizer state in host memory (ZeRO-Offload's split).
  if (r.in.offload == "cpu") plan.host = plan.run.peak.state.total();
  if (r.in.ckpt_async != "none") plan.staging = run.staging;
  plan.preflight = fsdp::host_memory_needed(run, r.in.sharded_init);
  return plan;
}

Report make_report(const PlanInputs& in) {
  check_inputs(in);
  Report r;
  r.in = in;
  r.model = plan_model(in);
  r.mp.param_dtype(fsdp::parse_dtype(in.param_dtype));
  if (!in.reduce_dtype.empty()) r.mp.reduce_dtype(fsdp::parse_dtype(in.reduce_dtype));
  r.per_node = in.world / in.nodes;
  for (auto s : strategies_asked(in)) r.plans.push_back(plan_strategy(r, s));
  if (in.budget > 0) {
    r.recommendation =
        recommend(r.model.units, in.world, r.per_node, r.mp, static_cast<int64_t>(std::llround(in.budget)));
  }
  if (!in.cluster_path.empty()) r.cluster = Cluster::load(in.cluster_path);
  // 6 N FLOPs per token for forward and backward, 2 N more to recompute;
  // or the preset's forward and backward as calibrate timed it.
  r.compute = r.cluster ? (in.checkpointing ? 8.0 : 6.0) * r.model.total_params *
                              static_cast<double>(r.model.shape.batch * r.model.shape.context) / r.cluster->flops
                        : 0.0;
  if (r.cluster && !in.preset.empty() && r.cluster->model_step_preset == in.preset && !in.layers && !in.width &&
      !in.batch && !in.context && !in.vocab && !in.heads &&
      in.kind() == fsdp::models::ModelKind::kGpt) {
    r.compute = r.cluster->model_step_s * (in.checkpointing ? 8.0 / 6.0 : 1.0);
  }
  r.disk_measured = r.cluster && r.cluster->disk_read_bandwidth > 0 && r.cluster->disk_write_bandwidth > 0;
  return r;
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
          {"param_dtype", fsdp::dtype_name(r.mp.param_dtype())},
          {"reduce_dtype", fsdp::dtype_name(r.mp.effective_reduce_dtype())},
          {"activation_checkpointing", in.checkpointing},
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
    times.push_back({{"strategy", fsdp::strategy_name(plan.run.strategy)},
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

void print_json(const Report& r) {
  nlohmann::json out;
  out["inputs"] = inputs_json(r);
  out["model"] = {{"parameters", r.model.total_params},
                  {"unit_numels", r.model.units},
                  {"largest_unit_numel", r.model.largest_unit}};
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

void print_strategy_table(const Report& r) {
  const fsdp::TransformerShape& shape = r.model.shape;
  std::cout << "model: " << r.model.total_params << " parameters in " << r.model.units.size() << " units ("
            << shape.layers << " blocks, " << r.in.wrap << " units, the largest " << r.model.largest_unit
            << "); vocab " << shape.vocab << ", context " << shape.context << ", width " << shape.width << ", heads "
            << shape.heads << ", batch " << shape.batch << " per rank\n"
            << "world: " << r.in.world << " ranks on " << r.in.nodes << " node(s); params "
            << fsdp::dtype_name(r.mp.param_dtype()) << ", reduce " << fsdp::dtype_name(r.mp.effective_reduce_dtype())
            << "; prefetch " << (r.in.prefetch ? "on" : "off") << "; activation checkpointing "
            << (r.in.checkpointing ? "on" : "off") << "; offload " << r.in.offload << "\n"
            << "per rank (AdamW: fp32 master + two fp32 moments = 12 B per parameter, sharded as the strategy says):\n";
  const char* columns[] = {"strategy", "params", "grads", "optimizer", "gathered", "activations", "bwd transient",
                           "device total", "host (offload)", "comm / step"};
  std::cout << std::left << std::setw(20) << columns[0];
  for (int i = 1; i < 10; ++i) std::cout << std::right << std::setw(i >= 5 ? 15 : 12) << columns[i];
  std::cout << "\n";
  for (const auto& plan : r.plans) {
    const auto& st = plan.run.peak.state;
    std::cout << std::left << std::setw(20) << fsdp::strategy_name(plan.run.strategy) << std::right << std::setw(12)
              << gib(st.params) << std::setw(12) << gib(st.grads) << std::setw(12) << gib(st.optimizer)
              << std::setw(12) << gib(plan.run.peak.gathered) << std::setw(15) << gib(plan.run.peak.activations)
              << std::setw(15) << gib(plan.run.peak.backward_transient) << std::setw(15) << gib(plan.device())
              << std::setw(15) << gib(plan.host) << std::setw(15) << gib(plan.run.comm.total()) << "\n";
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
    std::cout << std::left << std::setw(20) << fsdp::strategy_name(plan.run.strategy) << std::right << std::setw(15)
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
  const fsdp::RunPlan chosen = fsdp::plan_run(r.model.description, r.in.wrap == "sublayer",
                                              plan_options(r, r.recommendation->choice->strategy, false), plan_settings(r));
  std::cout << "  (on top of the budget: prefetch's unit ahead, activations and backward's buffers; "
            << fsdp::strategy_name(r.recommendation->choice->strategy) << "'s step peak is " << gib(chosen.peak.total())
            << ")\n";
}

void print_cluster_times(const Report& r) {
  std::cout << "step time per rank on the cluster (compute " << std::setprecision(3) << r.compute
            << " s; communication overlapped with it, except the first unit's gather):\n";
  for (const auto& plan : r.plans) {
    const fsdp::StepTime t = r.time_of(plan);
    std::cout << "  " << std::left << std::setw(20) << fsdp::strategy_name(plan.run.strategy) << " comm "
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
            << fsdp::quantization_name(z.gather_quantization()) << ", secondary partition "
            << (z.secondary_partition() ? "on" : "off") << ", gradient quantization "
            << fsdp::quantization_name(z.gradient_quantization()) << ", blocks of " << z.quantization_block()
            << "):\n";
  for (const auto& plan : r.plans) {
    std::cout << "  " << std::left << std::setw(20) << fsdp::strategy_name(plan.run.strategy) << std::right
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
    std::cout << "  " << std::left << std::setw(20) << fsdp::strategy_name(plan.run.strategy) << std::right << " rank 0 "
              << gib(plan.staging->rank0) << ", each other rank " << gib(plan.staging->per_rank) << "\n";
  }
}

void print_text(const Report& r) {
  print_strategy_table(r);
  if (r.in.nodes > 1 || r.in.zero_plus_plus().any()) print_hosts_table(r);
  if (r.in.offload.rfind("nvme", 0) == 0) print_nvme_table(r);
  if (r.in.ckpt_async != "none") print_staging(r);
  std::cout << "  (model state in bytes, as a run of fsdp-train measures it:";
  for (const auto& plan : r.plans) std::cout << " " << fsdp::strategy_name(plan.run.strategy) << " " << plan.run.peak.state.total();
  std::cout << ")\n";
  if (r.in.seed_accounting) print_seed_accounting(r);
  if (r.recommendation) print_recommendation(r);
  if (r.cluster) print_cluster_times(r);
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

int main(int argc, char** argv) {
  CLI::App app{"The memory planner: per-rank memory, communication and step time of each sharding strategy."};
  PlanInputs in;
  add_plan_options(app, in);
  auto* calibrate_cmd = app.add_subcommand("calibrate", "measure FLOP/s and all-gather bandwidth here (under fsdp-run)");
  CalibrateOptions calibration;
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
    return reporting_errors([&] {
      TORCH_CHECK(disk_mib > 0, "--disk-mib must be positive, got ", disk_mib);
      calibration.disk_bytes = disk_mib << 20;
      return calibrate(&argc, &argv, calibration);
    });
  }
  return reporting_errors([&] {
    const Report report = make_report(in);
    if (in.json) {
      print_json(report);
    } else {
      print_text(report);
    }
    return 0;
  });
}
