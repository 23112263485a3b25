// fsdp-plan calibrate: measures this cluster under fsdp-run (FLOP/s, the
// all-gather's bandwidth and latency; with --offload-dir the disk, with
// --preset the model's step, with --ranks-per-node the collectives a step
// runs and how much of them hides behind compute) and prints the cluster
// description; Cluster::load reads one back.

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "fsdp/gpt.h"
#include "plan/estimates.h"
#include "fsdp/options.h"
#include "offload/disk_store.h"
#include "plan/plan.h"
#include "tool_support.h"

namespace fsdp_plan {

void Cluster::load_measured(const nlohmann::json& j) {
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

Cluster Cluster::load(const std::string& path) {
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

namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

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

}  // namespace fsdp_plan
