// fsdp-train: trains the reference GPT with FULL_SHARD over the MPI ranks it
// is started on (through fsdp-run). Rank 0 prints progress and a summary and
// writes the log and the final weights.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include <csignal>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/grad_utils.h"
#include "fsdp/memory_plan.h"
#include "fsdp/gpt.h"
#include "fsdp/lr_schedule.h"
#include "fsdp/memory.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/trace.h"
#include "fsdp/train_step.h"

namespace {

using fsdp::memory::Category;
using Clock = std::chrono::steady_clock;

struct TrainOptions {
  std::string preset = "small";
  std::optional<int64_t> vocab, context, layers, heads, width, batch;
  int64_t steps = 100;
  double lr = 1e-3;
  uint64_t seed = 1337;
  std::string data;
  std::string data_order = "shuffled";
  uint64_t data_seed = 0;
  double val_fraction = 0.1;
  int64_t eval_every = 0;
  std::optional<int64_t> eval_sequences;
  std::string init_from;
  std::string save_final;
  std::string log;
  int threads = 0;
  int64_t print_every = 0;
  std::string strategy = "full_shard";
  int ranks_per_node = 0;
  int64_t memory_budget = 0;
  std::string param_dtype = "fp32";
  std::string reduce_dtype;
  int64_t grad_accum = 1;
  bool no_sync = false;
  double clip_grad_norm = 1.0;  // nanoGPT's default
  std::string lr_schedule = "constant";  // the spec's default: constant unless a schedule is asked for
  int64_t warmup_steps = 0;
  std::optional<double> min_lr;  // default: lr / 10 (nanoGPT's)
  double weight_decay = 0.0;
  std::string adamw = "fused";
  std::string device = "cpu";
  std::string backend = "auto";
  std::string offload = "none";
  std::string offload_optimizer = "none", offload_params = "none", offload_dir, offload_engine = "auto";
  bool no_preflight = false;
  double collective_timeout = 0.0;
  std::string ckpt_dir;
  int64_t ckpt_every = 0;
  int ckpt_keep = 2;
  std::string ckpt_format = "sharded";
  bool resume = false;
  bool forward_prefetch = false;
  std::string backward_prefetch = "pre";
  std::string wrap = "block";
  int prefetch_depth = 1;
  bool no_limit_all_gathers = false;
  bool no_block_cache = false;
  std::string trace;
  std::string summary;
  bool activation_checkpointing = false;
  bool sharded_init = false;
  std::string plot;
  int64_t sample = 0;
  double temperature = 0.8;
  std::string prompt = "The ";
  uint64_t sample_seed = 0;
};

// Preemption (Slurm's SIGTERM or --signal, Kubernetes' SIGTERM; fsdp-run
// turns its own SIGTERM into SIGUSR1, which mpirun forwards to every rank):
// the first SIGTERM or SIGUSR1 is noted, and the ranks agree at the next step
// boundary to save a checkpoint and stop; a second one ends the rank at once.
volatile std::sig_atomic_t preemption_signal = 0;
extern "C" void on_preemption_signal(int signal) {
  if (preemption_signal != 0) ::_exit(128 + signal);
  preemption_signal = signal;
}
void install_preemption_handlers() {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGUSR1}) ::sigaction(signal, &action, nullptr);
}
// The documented exit statuses of a preempted run (README: Preemption).
constexpr int kExitPreemptedSaved = 75;    // a checkpoint of the last step is in --ckpt-dir: requeue with --resume
constexpr int kExitPreemptedUnsaved = 76;  // no --ckpt-dir: nothing was saved

// A scheduler that started several tasks which MPI sees as worlds of one
// each (OpenMPI without PMIx under srun): every task would train alone,
// silently. mpirun's own ranks (OMPI_COMM_WORLD_SIZE) are not that case.
void check_scheduler_world(int world_size) {
  if (world_size != 1 || std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    TORCH_CHECK(!value || std::atoi(value) <= 1, "the scheduler started ", value, " tasks (", name, "=", value,
                "), but MPI sees a world of 1: each task would train alone. Start the ranks through the scheduler's ",
                "PMI (srun --mpi=pmix, with an OpenMPI built with PMIx) or with mpirun / fsdp-run inside the allocation");
  }
}

// Every rank must see the files the others write in the checkpoint folder,
// or a checkpoint would be written that no rank can load whole: rank 0
// writes a probe there, every rank reads it back.
void check_checkpoint_dir_shared(const std::string& dir, const fsdp::ProcessGroupPtr& world) {
  const std::filesystem::path probe = std::filesystem::path(dir) / ".fsdp-shared-probe";
  // Rank 0's token (its pid and clock), which every rank then looks for in the file.
  torch::Tensor token = torch::tensor(
      {static_cast<int64_t>(::getpid()) ^ static_cast<int64_t>(Clock::now().time_since_epoch().count())}, torch::kLong);
  world->broadcast(token, 0)->wait();
  const std::string expected = std::to_string(token.item<int64_t>());
  std::string error;
  if (world->rank() == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::ofstream(probe) << expected;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  world->barrier()->wait();
  std::string seen;
  std::ifstream(probe) >> seen;
  torch::Tensor blind = torch::zeros({world->size()}, torch::kInt);
  blind[world->rank()] = seen == expected ? 0 : 1;
  world->all_reduce(blind, fsdp::ReduceOp::kSum)->wait();
  world->barrier()->wait();
  if (world->rank() == 0) std::filesystem::remove(probe);
  TORCH_CHECK(error.empty(), "--ckpt-dir: cannot write in '", dir, "': ", error);
  std::ostringstream ranks;
  int count = 0;
  for (int r = 0; r < world->size(); ++r) {
    if (blind[r].item<int>()) ranks << (count++ ? ", " : "") << r;
  }
  TORCH_CHECK(count == 0, "--ckpt-dir '", dir, "' is not shared: rank(s) ", ranks.str(), " cannot see the file rank 0 ",
              "wrote there, so a checkpoint would be split across machines and could not be loaded. Put it on a file ",
              "system every host mounts (NFS, Lustre, ...)");
}

// --trace FILE.json: rank r writes FILE.rank<r>.json.
std::string trace_path(const std::string& path, int rank) {
  const std::string suffix = ".json";
  const bool json = path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (json ? path.substr(0, path.size() - suffix.size()) : path) + ".rank" + std::to_string(rank) + suffix;
}

std::string human_bytes(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

std::string human_seconds(double seconds) {
  std::ostringstream s;
  int64_t total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) s << total / 3600 << "h";
  if (total >= 60) s << (total / 60) % 60 << "m";
  s << total % 60 << "s";
  return s.str();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int default_threads(int world) {
  for (const char* var : {"FSDP_THREADS_PER_RANK", "OMP_NUM_THREADS"}) {
    if (const char* value = std::getenv(var)) {
      int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world);
}

fsdp::models::GPTConfig make_config(const TrainOptions& o) {
  auto c = fsdp::models::GPTConfig::preset(o.preset);
  if (o.vocab) c.vocab = *o.vocab;
  if (o.context) c.context = *o.context;
  if (o.layers) c.layers = *o.layers;
  if (o.heads) c.heads = *o.heads;
  if (o.width) c.width = *o.width;
  if (o.batch) c.batch = *o.batch;
  c.validate();
  return c;
}

// The schedule as checkpoints record it: a resumed run must continue the same one.
nlohmann::json schedule_json(const fsdp::LrSchedule& s) {
  return {{"kind", fsdp::lr_schedule_name(s.kind())}, {"lr", s.lr()}, {"warmup_steps", s.warmup_steps()},
          {"min_lr", s.min_lr()}, {"total_steps", s.total_steps()}};
}

// --resume refuses a schedule other than the checkpoint's: the run would not
// be the one that was interrupted (a cosine's length is part of it, so a
// cosine run cannot be extended by raising --steps). Checkpoints from before
// schedules were recorded are taken as they are.
void check_same_schedule(const nlohmann::json& extra, const fsdp::LrSchedule& mine, const std::string& path) {
  if (!extra.contains("lr_schedule")) return;
  const nlohmann::json& j = extra.at("lr_schedule");
  const auto saved = fsdp::LrSchedule()
                         .kind(fsdp::parse_lr_schedule(j.at("kind").get<std::string>()))
                         .lr(j.at("lr").get<double>())
                         .warmup_steps(j.at("warmup_steps").get<int64_t>())
                         .min_lr(j.at("min_lr").get<double>())
                         .total_steps(j.at("total_steps").get<int64_t>());
  TORCH_CHECK(saved.same_as(mine), "--resume: the checkpoint ", path, " was trained with the learning-rate schedule '",
              saved.describe(), "', this run asks for '", mine.describe(),
              "': pass the same --lr, --lr-schedule, --warmup-steps, --min-lr (and --steps for cosine)");
}

// Everything a run needs, built and checked before the first collective of
// training, so that bad input fails on every rank alike.
struct Run {
  fsdp::models::GPTConfig config;
  std::unique_ptr<fsdp::models::TokenData> data;
  fsdp::models::GPT model{nullptr};
  fsdp::FullyShardOptions fsdp_options;
  std::string strategy_reason;  // why --strategy auto picked what it did
  fsdp::CheckpointFormat ckpt_format = fsdp::CheckpointFormat::kSharded;
  double init_seconds = 0.0;     // reading --init-from
  fsdp::LrSchedule schedule;     // --lr-schedule, --warmup-steps, --min-lr over --steps
  // The sharded model, held here too: an error in training reaches main's
  // handler, which ends the job, with the model's process groups alive.
  // Destroying a group whose collective is stuck (the watchdog's case)
  // would wait for it forever.
  std::shared_ptr<void> sharded_model;
  std::ofstream log;
  c10::Device device = c10::Device(torch::kCPU);  // --device: where the units compute
  std::string backend = "mpi";                   // --backend, resolved
  int64_t ram_predicted = 0;                     // the preflight's host memory per rank (0: not checked)
  fsdp::ProcessGroupPtr group;                   // what the model is sharded over (world, or NCCL over it)
};

// --device cuda: this rank's GPU is its rank among the ranks of its host,
// modulo the GPUs it sees (several ranks share one where there are fewer).
// --backend auto: NCCL where every rank of the host has a GPU of its own,
// else MPI, which stages device tensors through host memory.
void choose_device(const TrainOptions& o, const fsdp::ProcessGroupPtr& world, Run& run) {
  TORCH_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '", o.device, "'");
  TORCH_CHECK(o.backend == "auto" || o.backend == "mpi" || o.backend == "nccl",
              "--backend must be auto, mpi or nccl, got '", o.backend, "'");
  TORCH_CHECK(o.offload == "none" || o.offload == "cpu", "--offload must be none or cpu, got '", o.offload, "'",
              o.offload == "nvme" ? " (offload to disk: --offload-optimizer nvme, --offload-params nvme)" : "");
  run.group = world;
  run.backend = "mpi";
  if (o.device == "cpu") {
    TORCH_CHECK(o.backend != "nccl", "--backend nccl needs --device cuda");
    return;
  }
  const int gpus = fsdp::cuda_device_count();
  TORCH_CHECK(gpus > 0, "--device cuda: ",
              fsdp::cuda_build() ? "this process sees no GPU (CUDA_VISIBLE_DEVICES, the driver?)"
                                 : "this fsdp-cpp was built without CUDA (build against a LibTorch with CUDA: "
                                   "scripts/setup.sh wheel)");
  const fsdp::ProcessGroupPtr host = world->split_shared_memory();
  run.device = c10::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(host->rank() % gpus));
  // This rank's current device from here on: pinned host memory and any
  // call without a device then make no context on GPU 0.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(run.device);
  const bool own_gpu = host->size() <= gpus;
  TORCH_CHECK(o.backend != "nccl" || own_gpu, "--backend nccl needs a GPU per rank: ", host->size(),
              " ranks on this host share ", gpus, " GPU(s); use --backend mpi (or auto)");
  if (o.backend == "nccl" || (o.backend == "auto" && own_gpu)) {
    run.group = fsdp::make_nccl_process_group(world, run.device);
    run.backend = "nccl";
  }
  run.fsdp_options.device(run.device);
}



double directory_bytes(const std::string& path) {
  double total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file()) total += static_cast<double>(entry.file_size());
  }
  return total;
}

// The element count of each unit the run's wrap policy makes, root first
// (what the planner's estimates take).
std::vector<int64_t> planned_unit_numels(Run& run) {
  std::vector<int64_t> numels;
  for (const auto& plan : fsdp::plan_units(*run.model, run.fsdp_options.wrap_policy())) {
    int64_t n = 0;
    for (const auto& p : plan.params) n += p.second.numel();
    numels.push_back(n);
  }
  return numels;
}

int ranks_per_node(const TrainOptions& o) {
  if (o.ranks_per_node > 0) return o.ranks_per_node;
  const char* env = std::getenv("FSDP_RANKS_PER_NODE");  // set by fsdp-run --ranks-per-node
  return env ? std::atoi(env) : 0;
}

// --wrap: a unit per transformer block, or one per attention and per MLP
// (half the largest gathered buffer, twice the collectives).
fsdp::WrapPolicy make_wrap_policy(const std::string& wrap) {
  using namespace fsdp::models;
  if (wrap == "block") return fsdp::module_type_policy<BlockImpl>();
  if (wrap == "sublayer") return fsdp::module_type_policy<AttentionImpl, MLPImpl>();
  TORCH_CHECK(false, "--wrap must be block or sublayer, got '", wrap, "'");
}

bool uses_nvme(const TrainOptions& o) { return o.offload_optimizer == "nvme" || o.offload_params == "nvme"; }

fsdp::FullyShardOptions make_fsdp_options(const TrainOptions& o) {
  fsdp::MixedPrecision mp;
  mp.param_dtype(fsdp::parse_dtype(o.param_dtype));
  if (!o.reduce_dtype.empty()) mp.reduce_dtype(fsdp::parse_dtype(o.reduce_dtype));
  auto options = fsdp::FullyShardOptions()
                     .wrap_policy(make_wrap_policy(o.wrap))
                     .mixed_precision(mp)
                     .ranks_per_node(ranks_per_node(o))
                     .forward_prefetch(o.forward_prefetch)
                     .backward_prefetch(fsdp::parse_backward_prefetch(o.backward_prefetch))
                     .prefetch_depth(o.prefetch_depth)
                     .limit_all_gathers(!o.no_limit_all_gathers)
                     .cache_host_blocks(!o.no_block_cache)
                     .activation_checkpointing(o.activation_checkpointing);
  TORCH_CHECK(o.prefetch_depth >= 1, "--prefetch-depth must be at least 1, got ", o.prefetch_depth);
  if (o.strategy != "auto") options.strategy(fsdp::parse_strategy(o.strategy));
  for (const std::string* value : {&o.offload_optimizer, &o.offload_params}) {
    TORCH_CHECK(*value == "none" || *value == "nvme", "--offload-optimizer and --offload-params must be none or nvme, got '",
                *value, "'");
  }
  if (uses_nvme(o)) {
    TORCH_CHECK(!o.offload_dir.empty(), "--offload-optimizer nvme and --offload-params nvme need --offload-dir DIR ",
                "(a folder on a disk with room for the offloaded state; fsdp-plan --offload nvme says how much)");
    TORCH_CHECK(std::filesystem::is_directory(o.offload_dir), "--offload-dir: '", o.offload_dir, "' is not a folder");
    TORCH_CHECK(o.offload == "none", "--offload cpu is for a GPU run; it cannot be combined with nvme offload");
    TORCH_CHECK(o.adamw == "fused", "nvme offload steps with fsdp::FusedAdamW: --adamw torch cannot be combined with it");
    options.nvme_offload(fsdp::NvmeOffloadOptions(o.offload_dir)
                             .optimizer_state(o.offload_optimizer == "nvme")
                             .params(o.offload_params == "nvme")
                             .store(fsdp::offload::DiskStoreOptions(o.offload_dir)
                                        .engine(fsdp::offload::parse_io_engine(o.offload_engine))));
  } else {
    TORCH_CHECK(o.offload_dir.empty(), "--offload-dir needs --offload-optimizer nvme or --offload-params nvme");
  }
  return options;
}

// --strategy auto: fsdp::choose_strategy's rule, the one fsdp-plan --budget
// applies too (model state plus gathered parameters, least communication first).
fsdp::ShardingStrategy pick_strategy(const TrainOptions& o, Run& run, int world) {
  TORCH_CHECK(o.memory_budget > 0,
              "--strategy auto needs --memory-budget BYTES (per-rank model state plus gathered parameters)");
  const fsdp::StrategyChoice choice =
      fsdp::choose_strategy(planned_unit_numels(run), world, run.fsdp_options.ranks_per_node(),
                            run.fsdp_options.mixed_precision(), o.memory_budget);
  run.strategy_reason = choice.reason;
  return choice.strategy;
}



// The memory this host can still give (bytes): /proc/meminfo's MemAvailable,
// or less under a cgroup v2 limit. FSDP_PREFLIGHT_AVAILABLE_BYTES overrides
// (to check the preflight itself).
int64_t host_memory_available() {
  if (const char* forced = std::getenv("FSDP_PREFLIGHT_AVAILABLE_BYTES")) return static_cast<int64_t>(std::atoll(forced));
  int64_t available = std::numeric_limits<int64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    available = std::min<int64_t>(available, std::atoll(max_text.c_str()) - current);
  }
  return available;
}

// The preflight: what the planner says this run needs per rank on the host
// (the step's peak tensors; without --sharded-init also the whole model
// each rank builds first; plus the runtime's own memory), times the ranks of
// this host, against what the host has. A run that cannot fit is refused
// before anything is allocated, with the planner's figures and the settings
// that would fit, instead of an out-of-memory kill minutes later.
//
// A run with disk offload is one sized against memory: its need also counts
// the host block cache's limit (reserved bytes that RSS shows; see
// fsdp::host_block_cache_limit), which in-memory runs leave out.
int64_t nvme_block_cache(const std::vector<int64_t>& unit_numels, int shard_group) {
  int64_t largest = 0;
  for (int64_t n : unit_numels) largest = std::max(largest, (n + shard_group - 1) / shard_group * shard_group);
  return fsdp::host_block_cache_limit(largest, true);
}

void preflight(const TrainOptions& o, Run& run, int world) {
  if (o.no_preflight || o.device != "cpu") return;  // a GPU run's host memory is not the step's peak
  const auto& c = run.config;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");  // mpirun's count of this host's ranks
  const int ranks_here = local ? std::max(1, std::atoi(local)) : world;
  const fsdp::ShardingStrategy strategy =
      o.strategy == "auto" ? fsdp::ShardingStrategy::kFullShard : fsdp::parse_strategy(o.strategy);
  const auto& options = run.fsdp_options;
  // Hybrid without --ranks-per-node: the nodes are the hosts, and this
  // host's ranks are the shard group (as fully_shard's shared-memory split).
  int node_ranks = options.ranks_per_node();
  if (node_ranks == 0) node_ranks = world % ranks_here == 0 ? ranks_here : world;
  const int per_node = fsdp::shard_group_size(strategy, world, node_ranks);
  constexpr int64_t kRuntimeBytes = int64_t{256} << 20;  // LibTorch, MPI, the data's pages: measured 180-250 MiB
  auto need = [&](bool checkpointing, bool sublayer, bool sharded_init, bool nvme_optimizer, bool nvme_params) {
    const fsdp::TransformerShape shape{c.vocab, c.context, c.layers, c.heads, c.width, c.batch, sublayer};
    const auto units = shape.unit_numels();
    const int64_t params = std::accumulate(units.begin(), units.end(), int64_t{0});
    const fsdp::StepPeak peak = fsdp::estimate_step_peak(
        shape, strategy, world, per_node, options.mixed_precision(),
        options.forward_prefetch() || options.backward_prefetch() != fsdp::BackwardPrefetch::kNone, checkpointing);
    int64_t step = peak.total();
    if (nvme_optimizer || nvme_params) {
      step = fsdp::peak_with_nvme_offload(peak, fsdp::estimate_nvme_offload(units, strategy, world, per_node,
                                                                            options.mixed_precision(), nvme_optimizer,
                                                                            nvme_params, o.grad_accum)) +
             nvme_block_cache(units, per_node);
    }
    // Building the whole model on every rank, then flattening its largest
    // unit; sharded, every unit's fp32 shard exists before it is offloaded.
    const int64_t construction =
        sharded_init ? (nvme_optimizer || nvme_params ? peak.state.params : 0)
                     : 4 * (params + *std::max_element(units.begin(), units.end()));
    return std::max(step, construction) + kRuntimeBytes;
  };
  const bool nvme_optimizer = o.offload_optimizer == "nvme", nvme_params = o.offload_params == "nvme";
  const int64_t available = host_memory_available();
  const int64_t needed = need(o.activation_checkpointing, o.wrap == "sublayer", o.sharded_init, nvme_optimizer, nvme_params);
  run.ram_predicted = needed;
  if (needed * ranks_here <= available) return;
  std::ostringstream alternatives;
  struct Variant {
    const char* flags;
    bool checkpointing, sublayer, sharded_init, nvme_optimizer, nvme_params;
  };
  const bool sublayer = o.wrap == "sublayer", ac = o.activation_checkpointing;
  const bool shardable = !fsdp::keeps_params_unsharded(strategy);
  std::vector<Variant> variants = {
      {"--sharded-init", ac, sublayer, true, nvme_optimizer, nvme_params},
      {"--sharded-init --activation-checkpointing", true, sublayer, true, nvme_optimizer, nvme_params},
      {"--sharded-init --activation-checkpointing --wrap sublayer", true, true, true, nvme_optimizer, nvme_params},
      {"--sharded-init --activation-checkpointing --offload-optimizer nvme", true, sublayer, true, true, nvme_params}};
  if (shardable && (o.param_dtype == "fp32" || nvme_optimizer)) {
    variants.push_back({"--sharded-init --activation-checkpointing --offload-optimizer nvme --offload-params nvme",
                        true, sublayer, true, true, true});
  }
  bool any = false;
  for (const auto& v : variants) {
    const int64_t n = need(v.checkpointing, v.sublayer, v.sharded_init, v.nvme_optimizer, v.nvme_params);
    alternatives << "\n  " << v.flags << ": " << human_bytes(n) << " per rank, " << human_bytes(n * ranks_here)
                 << (n * ranks_here <= available ? " (fits)" : " (does not fit)");
    any = any || n * ranks_here <= available;
  }
  TORCH_CHECK(false, "preflight: this run needs about ", human_bytes(needed), " per rank on the host (the planner's step peak",
              o.sharded_init ? "" : " or the whole model each rank builds first", ", plus ", human_bytes(kRuntimeBytes),
              " of runtime), ", ranks_here, " rank(s) here: ", human_bytes(needed * ranks_here), ", but the host has ",
              human_bytes(available), " available. With other settings:", alternatives.str(),
              any ? "" : "\n  none fits: fewer ranks on this host, a smaller --batch or --context, or bf16 parameters",
              "\n(fsdp-plan gives the whole table; --no-preflight runs anyway)");
}

Run prepare(const TrainOptions& o, const fsdp::ProcessGroupPtr& world) {
  const int rank = world->rank();
  Run run;
  run.config = make_config(o);
  TORCH_CHECK(o.steps > 0, "--steps must be positive, got ", o.steps);
  TORCH_CHECK(o.lr > 0, "--lr must be positive, got ", o.lr);
  TORCH_CHECK(o.grad_accum > 0, "--grad-accum must be positive, got ", o.grad_accum);
  TORCH_CHECK(o.sample >= 0 && o.temperature >= 0, "--sample and --temperature must be >= 0");
  TORCH_CHECK(o.clip_grad_norm >= 0, "--clip-grad-norm must be positive, got ", o.clip_grad_norm);
  TORCH_CHECK(o.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.weight_decay);
  TORCH_CHECK(o.adamw == "fused" || o.adamw == "torch", "--adamw must be fused or torch, got '", o.adamw, "'");
  TORCH_CHECK(o.lr_schedule == "cosine" || !o.min_lr, "--min-lr needs --lr-schedule cosine");
  run.schedule = fsdp::LrSchedule()
                     .kind(fsdp::parse_lr_schedule(o.lr_schedule))
                     .lr(o.lr)
                     .warmup_steps(o.warmup_steps)
                     .min_lr(o.min_lr.value_or(o.lr / 10))
                     .total_steps(o.steps);
  run.schedule.validate();
  TORCH_CHECK(o.ckpt_every >= 0 && o.ckpt_keep >= 1, "--ckpt-every must be >= 0 and --ckpt-keep >= 1");
  TORCH_CHECK(!o.ckpt_dir.empty() || (o.ckpt_every == 0 && !o.resume), "--ckpt-every and --resume need --ckpt-dir");
  run.ckpt_format = fsdp::parse_checkpoint_format(o.ckpt_format);
  run.fsdp_options = make_fsdp_options(o);
  preflight(o, run, world->size());
  if (!o.trace.empty()) {
    const auto dir = std::filesystem::path(trace_path(o.trace, rank)).parent_path();
    TORCH_CHECK(dir.empty() || std::filesystem::is_directory(dir), "--trace: the directory '", dir.string(),
                "' does not exist");
  }
  std::string data_path = o.data.empty() ? std::string(FSDP_DEFAULT_CORPUS) : o.data;
  TORCH_CHECK(!o.data.empty() || std::ifstream(data_path).good(), "the built-in default corpus '", data_path,
              "' is missing: run scripts/setup.sh, or pass --data FILE");
  TORCH_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1), got ", o.val_fraction);
  run.data = std::make_unique<fsdp::models::TokenData>(
      data_path, run.config.context, run.config.vocab,
      fsdp::models::TokenDataOptions()
          .order(fsdp::models::parse_data_order(o.data_order))
          .seed(o.data_seed)
          .val_fraction(o.val_fraction));
  TORCH_CHECK(o.eval_every >= 0, "--eval-every must be >= 0, got ", o.eval_every);
  TORCH_CHECK(o.eval_every == 0 || o.val_fraction > 0, "--eval-every ", o.eval_every,
              " needs a validation split, but --val-fraction is 0");
  // Each rank evaluates E / W sequences, so that every rank runs the same
  // number of forwards (their all-gathers): E must split evenly.
  TORCH_CHECK(!o.eval_sequences || (*o.eval_sequences > 0 && *o.eval_sequences % world->size() == 0),
              "--eval-sequences must be a positive multiple of the world size ", world->size(), ", got ",
              o.eval_sequences.value_or(0));
  TORCH_CHECK(!o.sharded_init || o.init_from.empty(), "--sharded-init draws the initial weights unit by unit; "
              "it cannot be combined with --init-from");
  fsdp::memory::reset_peaks();
  if (o.sharded_init) {
    fsdp::memory::DeferredInit deferred;  // shapes only: fully_shard initializes unit by unit
    run.model = fsdp::models::GPT(run.config);
  } else {
    run.model = fsdp::models::GPT(run.config);
    run.model->init_weights(o.seed);
  }
  if (!o.init_from.empty()) {
    const auto start = Clock::now();
    fsdp::load_full_weights(*run.model, o.init_from);
    run.init_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (o.strategy == "auto") run.fsdp_options.strategy(pick_strategy(o, run, world->size()));
  choose_device(o, world, run);
  run.fsdp_options.cpu_offload(o.offload == "cpu");
  if (!o.plot.empty()) {
    TORCH_CHECK(std::system("command -v gnuplot > /dev/null 2>&1") == 0,
                "--plot needs gnuplot (Debian: apt-get install gnuplot-nox)");
    std::filesystem::create_directories(o.plot);
  }
  if (rank == 0 && !o.log.empty()) {
    run.log.open(o.log, o.resume ? std::ios::app : std::ios::trunc);
    TORCH_CHECK(run.log, "cannot open the log file '", o.log, "' for writing");
  }
  return run;
}

// --sample N: rank 0 generates N tokens from --prompt with the whole
// parameters (an UnshardScope: collective on entry and exit, nothing
// collective inside it), greedily at temperature 0, else sampled.
void print_sample(fsdp::FullyShardedModule<fsdp::models::GPTImpl>& model, const TrainOptions& o, int rank,
                  c10::Device device) {
  fsdp::UnshardScope whole(model.state());
  if (rank != 0) return;
  const auto& c = model->config();
  torch::NoGradGuard no_grad;
  torch::manual_seed(o.sample_seed);
  std::vector<int64_t> tokens;
  for (unsigned char ch : o.prompt) tokens.push_back(static_cast<int64_t>(ch) % c.vocab);
  if (tokens.empty()) tokens.push_back('\n' % c.vocab);
  for (int64_t i = 0; i < o.sample; ++i) {
    const int64_t window = std::min<int64_t>(static_cast<int64_t>(tokens.size()), c.context);
    torch::Tensor idx = torch::tensor(std::vector<int64_t>(tokens.end() - window, tokens.end()), torch::kLong)
                            .view({1, -1})
                            .to(device);
    torch::Tensor last = model->logits(idx).select(1, window - 1).squeeze(0).to(torch::kFloat);
    const int64_t next = o.temperature <= 0 ? last.argmax().item<int64_t>()
                                            : torch::multinomial(torch::softmax(last / o.temperature, 0), 1).item<int64_t>();
    tokens.push_back(next);
  }
  std::cout << "\n== sample (" << o.sample << " tokens, ";
  if (o.temperature <= 0) {
    std::cout << "greedy";
  } else {
    std::ostringstream temperature;  // as given (std::cout may hold std::fixed from the progress lines)
    temperature << o.temperature;
    std::cout << "temperature " << temperature.str();
  }
  std::cout << ", prompt included) ==\n";
  if (c.vocab <= 256) {
    for (int64_t t : tokens) std::cout << static_cast<char>(t);
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) std::cout << (i ? " " : "") << tokens[i];
  }
  std::cout << "\n" << std::flush;
}

int train(const TrainOptions& o, Run& run, const fsdp::ProcessGroupPtr& world) {
  const int rank = world->rank(), W = world->size();
  const auto& c = run.config;
  const int64_t num_params = run.model->num_parameters();
  const std::vector<int64_t> unit_numels = planned_unit_numels(run);
  if (o.sharded_init) {
    // The same draws as init_weights: seeded alike, parameter by parameter in named order.
    torch::manual_seed(o.seed);
    fsdp::models::GPT gpt = run.model;
    run.fsdp_options.param_init_fn(
        [gpt](const std::string& name, torch::Tensor& param) { gpt->init_parameter(name, param); });
  }
  auto model = fsdp::fully_shard(run.model, run.group, run.fsdp_options);
  run.sharded_model = std::make_shared<decltype(model)>(model);
  // Building and sharding the model: this rank's peak tensor bytes so far.
  const int64_t construction_peak = fsdp::memory::usage().peak_total;
  fsdp::FsdpState& state = model.state();
  const fsdp::ShardingStrategy strategy = run.fsdp_options.strategy();
  // Both are torch::optim::AdamW to the library and to checkpoints: a run may
  // resume with the other.
  const auto adamw_options = torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
  std::unique_ptr<torch::optim::AdamW> optimizer_owner =
      o.adamw == "fused" ? std::make_unique<fsdp::FusedAdamW>(model.parameters(), adamw_options)
                         : std::make_unique<torch::optim::AdamW>(model.parameters(), adamw_options);
  torch::optim::AdamW& optimizer = *optimizer_owner;
  const auto& mp = run.fsdp_options.mixed_precision();
  // The step itself (accumulation, loss scaling, clipping, skipping on
  // overflow, the figures) is the library's: this tool is a front end to it.
  fsdp::TrainStep train_step(model, optimizer,
                             fsdp::TrainStepOptions()
                                 .micro_steps(o.grad_accum)
                                 .no_sync(o.no_sync)
                                 .clip_grad_norm(o.clip_grad_norm)
                                 .weight_decay(o.weight_decay));
  fsdp::GradScaler* scaler = train_step.scaler();
  const bool skip_sync = train_step.syncs_only_last_micro_step();

  const int shard_group_size = state.shard_group() ? state.shard_group()->size() : 1;
  const fsdp::ModelStateBytes predicted = fsdp::estimate_model_state(unit_numels, strategy, W, shard_group_size, mp);
  const fsdp::StepPeak predicted_peak = fsdp::estimate_step_peak(
      fsdp::TransformerShape{c.vocab, c.context, c.layers, c.heads, c.width, c.batch, o.wrap == "sublayer"}, strategy, W,
      shard_group_size, mp, o.forward_prefetch || o.backward_prefetch != "none", o.activation_checkpointing, unit_numels);
  const std::optional<fsdp::offload::NvmeOffloadInfo> nvme = state.nvme_offload();
  std::optional<fsdp::NvmeOffloadPlan> nvme_plan;
  if (nvme) {
    nvme_plan = fsdp::estimate_nvme_offload(unit_numels, strategy, W, shard_group_size, mp,
                                            nvme->optimizer_state, nvme->params, o.grad_accum);
  }
  const int64_t predicted_peak_bytes =
      nvme_plan ? fsdp::peak_with_nvme_offload(predicted_peak, *nvme_plan) : predicted_peak.total();
  const int64_t A = o.grad_accum;
  const int64_t tokens_per_step = c.batch * c.context * W * A;
  const int64_t print_every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 20);
  if (rank == 0) {
    std::cout << "fsdp-train: GPT " << o.preset << " (" << c.describe() << "), " << num_params << " parameters\n"
              << "  " << fsdp::strategy_name(strategy) << " over " << W << " rank(s)";
    if (state.shard_group()) std::cout << ", shard group of " << state.shard_group()->size();
    if (state.replicate_group()) std::cout << ", replicate group of " << state.replicate_group()->size();
    std::cout << ", " << state.units().size() << " units (wrap " << o.wrap << "), " << torch::get_num_threads() << " thread(s) per rank\n"
              << "  params " << fsdp::dtype_name(mp.param_dtype()) << ", reduce "
              << fsdp::dtype_name(mp.effective_reduce_dtype()) << (scaler ? " with loss scaling" : "")
              << ", " << A << " micro-step(s) per step" << (skip_sync ? " (reduced on the last)" : "") << ", "
              << tokens_per_step << " tokens per step\n"
              << "  prefetch: forward " << (o.forward_prefetch ? "on" : "off") << ", backward " << o.backward_prefetch
              << ", depth " << o.prefetch_depth << (o.no_limit_all_gathers ? ", unlimited" : ", limited to one unit ahead")
              << "; activation checkpointing " << (o.activation_checkpointing ? "on" : "off") << "\n"
              << "  AdamW (" << (o.adamw == "fused" ? "fsdp::FusedAdamW" : "torch::optim::AdamW") << "): lr "
              << run.schedule.describe() << "; weight decay " << o.weight_decay
              << " (matrices only); clip grad norm " << o.clip_grad_norm << " (0: off)\n"
              << "  data: " << run.data->path() << " (" << run.data->size() << " tokens, " << run.data->val_size()
              << " held out for validation; " << o.data_order << " order, seed " << o.data_seed << ")\n";
    if (!run.strategy_reason.empty()) std::cout << "  " << run.strategy_reason << "\n";
    if (nvme) {
      std::cout << "  nvme offload: " << (nvme->optimizer_state ? "optimizer state" : "")
                << (nvme->optimizer_state && nvme->params ? " and " : "")
                << (nvme->params ? "parameters" : "") << " in " << nvme->file_path << " ("
                << nvme->engine_description << "), " << human_bytes(nvme->offloaded_bytes)
                << " per rank on disk\n";
    }
    if (!o.init_from.empty()) {
      const double mb = std::filesystem::file_size(o.init_from) / 1e6;
      std::cout << "  initialized from " << o.init_from << " (" << std::fixed << std::setprecision(1) << mb
                << " MB in " << std::setprecision(2) << run.init_seconds << " s on each rank, " << std::setprecision(0)
                << mb / run.init_seconds << " MB/s)\n";
    }
    std::cout << "  construction (model built and sharded" << (o.sharded_init ? ", sharded initialization" : "")
              << "): rank 0's tensor memory peaked at " << human_bytes(construction_peak) << "\n";
    std::cout << "  per-rank model state by formula: " << predicted.total() << " B (params " << predicted.params
              << ", grads " << predicted.grads << ", optimizer " << predicted.optimizer << ")\n";
    std::cout << std::flush;
  }

  // The data order a checkpoint was trained in: a resume in another would
  // silently continue with other batches.
  const nlohmann::json data_order = {
      {"order", o.data_order}, {"seed", o.data_seed}, {"val_fraction", o.val_fraction}};
  int64_t first_step = 0;
  std::string resumed_from;  // the checkpoint loaded by --resume, for the summary
  if (!o.ckpt_dir.empty()) check_checkpoint_dir_shared(o.ckpt_dir, world);
  if (o.resume) {
    const std::string latest = fsdp::latest_checkpoint(o.ckpt_dir);
    if (latest.empty()) {
      if (rank == 0) std::cout << "  no checkpoint in " << o.ckpt_dir << ": starting at step 0\n";
    } else {
      const auto load_start = Clock::now();
      nlohmann::json meta = fsdp::load_checkpoint(state, optimizer, latest);
      world->barrier()->wait();
      const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
      first_step = meta.at("step").get<int64_t>();
      const nlohmann::json saved = meta.at("extra").value("data", data_order);
      TORCH_CHECK(saved == data_order, "--resume: ", latest, " was trained with data order ", saved.dump(),
                  " but this run asks for ", data_order.dump(),
                  ": pass the same --data-order, --data-seed and --val-fraction to continue the same batches");
      resumed_from = latest;
      check_same_schedule(meta.at("extra"), run.schedule, latest);
      if (scaler && meta.at("extra").contains("loss_scale")) {
        scaler->set_scale_factor(meta.at("extra").at("loss_scale").get<double>());
      }
      if (rank == 0) {
        const double mb = directory_bytes(latest) / 1e6;
        std::cout << "  resumed from " << latest << " (step " << first_step << ", saved by "
                  << meta.at("world_size") << " ranks with " << meta.at("strategy").get<std::string>() << "); loaded "
                  << std::fixed << std::setprecision(1) << mb << " MB in " << std::setprecision(2) << load_s << " s ("
                  << std::setprecision(0) << mb / load_s << " MB/s)\n";
      }
    }
  }
  if (first_step >= o.steps) {
    if (rank == 0) {
      std::cout << "nothing left to train: the checkpoint is at step " << first_step << " and --steps is " << o.steps
                << " (raise --steps to continue training)\n";
    }
    return 0;
  }
  auto save_checkpoint = [&](int64_t completed_steps) {
    nlohmann::json extra = {{"config", c.describe()}, {"preset", o.preset}, {"data", data_order}};
    if (scaler) extra["loss_scale"] = scaler->scale_factor();
    extra["lr_schedule"] = schedule_json(run.schedule);
    extra["weight_decay"] = o.weight_decay;
    const auto save_start = Clock::now();
    fsdp::memory::reset_peaks();
    const int64_t live_before = fsdp::memory::usage().live_total;
    const std::string path = fsdp::save_checkpoint(state, optimizer, o.ckpt_dir, completed_steps, extra, run.ckpt_format);
    const int64_t peak_extra = fsdp::memory::usage().peak_total - live_before;
    const double save_s = std::chrono::duration<double>(Clock::now() - save_start).count();
    if (rank == 0) fsdp::prune_checkpoints(o.ckpt_dir, o.ckpt_keep);
    world->barrier()->wait();
    if (rank == 0) {
      const double mb = directory_bytes(path) / 1e6;
      std::cout << "  checkpoint: " << path << " (" << std::fixed << std::setprecision(1) << mb << " MB in "
                << std::setprecision(2) << save_s << " s, " << std::setprecision(0) << mb / save_s
                << " MB/s; rank 0's tensor memory peaked " << human_bytes(peak_extra) << " above its live bytes)\n"
                << std::flush;
    }
  };

  std::vector<double> step_times, exposed_comm_times, optimizer_times, offload_wait_times, offload_read, offload_written;
  int64_t preempted_after = 0;  // the last step done when the ranks agreed to stop on a signal (0: none)
  fsdp::CommStats last_comm;
  std::vector<fsdp::RankFigures> last_figures(W);
  std::vector<int64_t> max_peak(W, 0);
  double final_loss = 0.0;
  int64_t skipped_steps = 0;
  // Validation: rank r takes sequences r * E/W ... (r + 1) * E/W - 1 in
  // chunks of at most a batch; the loss is the mean over all E sequences.
  const int64_t eval_sequences = o.eval_sequences.value_or((64 + W - 1) / W * W);
  std::optional<double> final_val_loss;
  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;  // forward only: every unit reshards after it
    const int64_t per_rank = eval_sequences / W;
    double sum = 0.0;
    for (int64_t first = 0; first < per_rank; first += c.batch) {
      const int64_t rows = std::min(c.batch, per_rank - first);
      auto [x, y] = run.data->val_batch(rank * per_rank + first, rows);
      sum += model.forward(x.to(run.device), y.to(run.device)).item<double>() * static_cast<double>(rows);
    }
    state.check_idle();
    torch::Tensor total = torch::tensor({sum}, torch::kDouble);
    world->all_reduce(total, fsdp::ReduceOp::kSum)->wait();
    return total.item<double>() / static_cast<double>(eval_sequences);
  };
  // The run's device peak: TrainStep restarts the allocator's peak at every
  // step, so what came between steps (construction, evaluation) is folded
  // in before each one, and the step's own after it.
  fsdp::memory::DeviceUsage run_device_peak;
  auto fold_device_peak = [&] {
    const fsdp::memory::DeviceUsage now = fsdp::memory::device_usage(run.device);
    run_device_peak.peak_allocated = std::max(run_device_peak.peak_allocated, now.peak_allocated);
    run_device_peak.peak_reserved = std::max(run_device_peak.peak_reserved, now.peak_reserved);
  };
  if (!o.trace.empty()) fsdp::trace::enable();
  const auto run_start = Clock::now();
  for (int64_t step = first_step; step < o.steps; ++step) {
    fsdp::trace::Span step_span("step " + std::to_string(step + 1), "step");
    const double lr = run.schedule.lr_at(step);
    fsdp::set_learning_rate(optimizer, lr);
    fold_device_peak();
    const fsdp::StepResult result = train_step([&](int64_t micro) {
      auto [x, y] = run.data->batch(step, micro, rank, W, A, c.batch);
      return model.forward(x.to(run.device, /*non_blocking=*/true), y.to(run.device, /*non_blocking=*/true));
    });
    const double step_s = result.step_s;
    const fsdp::CommStats& comm = result.comm;
    const bool stepped = result.stepped;
    const double grad_norm = result.grad_norm.value_or(-1.0);
    skipped_steps += stepped ? 0 : 1;
    last_comm = comm;
    final_loss = result.loss;
    std::optional<double> val_loss;
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      val_loss = evaluate();
      final_val_loss = val_loss;
    }
    if (step > first_step || o.steps == first_step + 1) {
      step_times.push_back(step_s);
      exposed_comm_times.push_back(comm.wait_seconds);
      optimizer_times.push_back(result.optimizer_s);
      offload_wait_times.push_back(result.offload_wait_s);
      offload_read.push_back(static_cast<double>(result.offload_bytes_read));
      offload_written.push_back(static_cast<double>(result.offload_bytes_written));
    }
    const bool saved =
        !o.ckpt_dir.empty() && ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps);
    if (saved) save_checkpoint(step + 1);
    // Every rank learns whether any rank was signalled (a signal during the
    // save above is seen here, after it completed).
    torch::Tensor signalled = torch::tensor({static_cast<int>(preemption_signal != 0)}, torch::kInt);
    world->all_reduce(signalled, fsdp::ReduceOp::kSum)->wait();
    if (signalled.item<int>() > 0) {
      preempted_after = step + 1;
      if (!saved && !o.ckpt_dir.empty()) save_checkpoint(step + 1);
    }
    if (rank != 0) {
      if (preempted_after) break;
      continue;
    }

    last_figures = result.per_rank;
    std::vector<int64_t> model_state(W), peak(W);
    for (int r = 0; r < W; ++r) {
      model_state[r] = last_figures[r].model_state_bytes;
      peak[r] = last_figures[r].peak_tensor_bytes;
      max_peak[r] = std::max(max_peak[r], peak[r]);
    }
    const double tokens_per_s = tokens_per_step / step_s;
    if (run.log.is_open()) {
      nlohmann::json comm_bytes;
      for (auto kind : {fsdp::CollectiveKind::kAllGather, fsdp::CollectiveKind::kReduceScatter,
                        fsdp::CollectiveKind::kAllReduce}) {
        comm_bytes[fsdp::collective_name(kind)] = comm.bytes[static_cast<size_t>(kind)];
      }
      nlohmann::json line = {{"step", step + 1},
                             {"loss", final_loss},
                             {"step_s", step_s},
                             {"tokens_per_s", tokens_per_s},
                             {"lr", lr},
                             {"world_size", W},
                             {"strategy", fsdp::strategy_name(strategy)},
                             {"comm_bytes", comm_bytes},
                             {"exposed_comm_s", comm.wait_seconds},
                             {"optimizer_s", result.optimizer_s},
                             {"offload_bytes_read", result.offload_bytes_read},
                             {"offload_bytes_written", result.offload_bytes_written},
                             {"offload_wait_s", result.offload_wait_s},
                             {"model_state_bytes", model_state},
                             {"peak_tensor_bytes", peak}};
      if (!run.device.is_cpu()) {  // the GPU's figures beside the host's (per rank)
        for (int r = 0; r < W; ++r) {
          line["device_peak_bytes"].push_back(last_figures[r].device_peak_bytes);
          line["device_model_state_bytes"].push_back(last_figures[r].device_model_state_bytes);
          line["device_gathered_peak_bytes"].push_back(last_figures[r].device_gathered_peak_bytes);
        }
      }
      if (grad_norm >= 0) line["grad_norm"] = grad_norm;
      if (val_loss) line["val_loss"] = *val_loss;
      if (scaler) {
        line["skipped"] = !stepped;
        line["loss_scale"] = scaler->scale_factor();
      }
      run.log << line.dump() << "\n" << std::flush;
    }
    if ((step + 1) % print_every == 0 || step == 0 || step + 1 == o.steps || preempted_after) {
      const double typical = step_times.empty() ? step_s : median(step_times);
      std::cout << "step " << std::setw(5) << step + 1 << "/" << o.steps << " | loss " << std::fixed
                << std::setprecision(4) << final_loss << " | " << std::setprecision(0) << tokens_per_s << " tok/s | "
                << std::setprecision(3) << step_s << " s/step | ETA "
                << human_seconds(typical * static_cast<double>(o.steps - step - 1));
      if (val_loss) std::cout << " | val loss " << std::setprecision(4) << *val_loss;
      if (!stepped) std::cout << " | skipped (overflow)";
      std::cout << "\n" << std::flush;
    }
    if (preempted_after) break;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
  // Every rank's peak resident set (the runtime included), for the summary.
  struct rusage usage_now {};
  ::getrusage(RUSAGE_SELF, &usage_now);
  // The GPU's peak over the run (the CUDA caching allocator's), the largest
  // of any rank: 0 on the CPU.
  fold_device_peak();
  torch::Tensor device_peaks = torch::empty({W, 2}, torch::kLong);
  world->all_gather(device_peaks,
                    torch::tensor({run_device_peak.peak_allocated, run_device_peak.peak_reserved}, torch::kLong))
      ->wait();
  const int64_t peak_device = device_peaks.select(1, 0).max().item<int64_t>();
  const int64_t peak_device_reserved = device_peaks.select(1, 1).max().item<int64_t>();
  torch::Tensor rss = torch::empty({W}, torch::kLong);
  world->all_gather(rss, torch::tensor({static_cast<int64_t>(usage_now.ru_maxrss) * 1024}, torch::kLong))->wait();
  if (rank == 0 && !o.summary.empty()) {
    nlohmann::json peak_by_category;  // each category's own peak in the last step (they need not coincide)
    const auto usage_last = fsdp::memory::usage();
    for (size_t k = 0; k < fsdp::memory::kNumCategories; ++k) {
      const auto category = static_cast<Category>(k);
      peak_by_category[fsdp::memory::category_name(category)] = usage_last.peak(category);
    }
    nlohmann::json comm_bytes;
    for (auto kind : {fsdp::CollectiveKind::kAllGather, fsdp::CollectiveKind::kReduceScatter,
                      fsdp::CollectiveKind::kAllReduce}) {
      comm_bytes[fsdp::collective_name(kind)] = last_comm.bytes[static_cast<size_t>(kind)];
    }
    std::vector<int64_t> model_state(W), rss_bytes(rss.data_ptr<int64_t>(), rss.data_ptr<int64_t>() + W);
    for (int r = 0; r < W; ++r) model_state[r] = last_figures[r].model_state_bytes;
    nlohmann::json model_state_by_kind;  // per rank, split as fsdp-plan splits it
    nlohmann::json device_model_state = nlohmann::json::array();
    for (int r = 0; r < W; ++r) device_model_state.push_back(last_figures[r].device_model_state_bytes);
    // The device's memory by category, per rank (the last step's): model
    // state by kind at the step's end, and the peak of the gathered
    // parameter buffers (ours, exact); the caching allocator's totals are
    // peak_device_bytes and peak_device_reserved_bytes.
    nlohmann::json device_by_category = nlohmann::json::object();
    if (!run.device.is_cpu()) {
      for (int r = 0; r < W; ++r) {
        device_by_category["params"].push_back(last_figures[r].device_param_shard_bytes);
        device_by_category["grads"].push_back(last_figures[r].device_grad_shard_bytes);
        device_by_category["optimizer"].push_back(last_figures[r].device_optimizer_state_bytes);
        device_by_category["gathered_peak"].push_back(last_figures[r].device_gathered_peak_bytes);
        device_by_category["step_peak"].push_back(last_figures[r].device_peak_bytes);
      }
    }
    for (int r = 0; r < W; ++r) {
      model_state_by_kind["params"].push_back(last_figures[r].param_shard_bytes);
      model_state_by_kind["grads"].push_back(last_figures[r].grad_shard_bytes);
      model_state_by_kind["optimizer"].push_back(last_figures[r].optimizer_state_bytes);
    }
    const double typical = median(step_times);
    nlohmann::json summary = {{"preset", o.preset},
                              {"world_size", W},
                              {"strategy", fsdp::strategy_name(strategy)},
                              {"param_dtype", fsdp::dtype_name(mp.param_dtype())},
                              {"reduce_dtype", fsdp::dtype_name(mp.effective_reduce_dtype())},
                              {"forward_prefetch", o.forward_prefetch},
                              {"backward_prefetch", o.backward_prefetch},
                              {"activation_checkpointing", o.activation_checkpointing},
                              {"wrap", o.wrap},
                              {"construction_peak_bytes", construction_peak},
                              {"threads_per_rank", torch::get_num_threads()},
                              {"adamw", o.adamw},
                              {"device", run.device.str()},
                              {"backend", run.backend},
                              {"offload", o.offload},
                              {"peak_device_bytes", peak_device},
                              {"peak_device_reserved_bytes", peak_device_reserved},
                              {"device_model_state_bytes", device_model_state},
                              {"device_memory_by_category", device_by_category},
                              // The planner's step peak as fsdp-plan --offload splits it: with
                              // offload the model state is on the host (CPU kernels' activations).
                              {"peak_device_bytes_predicted",
                               run.device.is_cpu() ? int64_t{0}
                                                   : predicted_peak.total() -
                                                         (o.offload == "cpu" ? predicted_peak.state.total() : 0)},
                              {"libtorch", c10::str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".",
                                                    TORCH_VERSION_PATCH)},
                              {"steps", o.steps},
                              {"final_loss", final_loss},
                              {"step_s", typical},
                              {"tokens_per_s", tokens_per_step / typical},
                              {"exposed_comm_s", median(exposed_comm_times)},
                              {"optimizer_s", median(optimizer_times)},
                              {"peak_tensor_bytes", max_peak},
                              {"model_state_bytes", model_state},
                              {"model_state_bytes_predicted", predicted.total()},
                              {"peak_tensor_bytes_predicted", predicted_peak_bytes},
                              {"peak_rss_bytes", rss_bytes},
                              {"ram_bytes_predicted", run.ram_predicted},
                              {"last_step_peak_by_category_rank0", peak_by_category},
                              {"model_state_bytes_by_kind", model_state_by_kind},
                              {"comm_bytes", comm_bytes},
                              {"units", state.units().size()},
                              {"shard_group_size", shard_group_size},
                              {"replicate_group_size", state.replicate_group() ? state.replicate_group()->size() : 1},
                              {"prefetch_depth", o.prefetch_depth},
                              {"limit_all_gathers", !o.no_limit_all_gathers},
                              {"block_cache_bytes", fsdp::memory::block_cache_limit()},
                              {"offload_optimizer", o.offload_optimizer},
                              {"offload_params", o.offload_params},
                              {"offload_engine", nvme ? nvme->engine_description : ""},
                              {"offload_file_bytes", nvme ? nvme->offloaded_bytes : 0},
                              {"offload_file_bytes_predicted", nvme_plan ? nvme_plan->file_bytes : 0},
                              {"offload_read_bytes_per_step", median(offload_read)},
                              {"offload_written_bytes_per_step", median(offload_written)},
                              {"offload_io_bytes_per_step_predicted", nvme_plan ? nvme_plan->io_per_step() : 0},
                              {"offload_wait_s", median(offload_wait_times)},
                              {"first_step", first_step},
                              {"preempted_after_step", preempted_after ? nlohmann::json(preempted_after) : nlohmann::json()},
                              {"resumed_from", resumed_from.empty() ? nlohmann::json() : nlohmann::json(resumed_from)}};
    if (!run.strategy_reason.empty()) summary["strategy_reason"] = run.strategy_reason;
    summary["data_order"] = o.data_order;
    summary["data_seed"] = o.data_seed;
    summary["val_fraction"] = o.val_fraction;
    if (final_val_loss) {
      summary["final_val_loss"] = *final_val_loss;
      summary["eval_sequences"] = eval_sequences;
    }
    std::ofstream out(o.summary);
    out << summary.dump() << "\n";
    TORCH_CHECK(out.good(), "writing the summary '", o.summary, "' failed");
  }
  if (rank == 0 && !o.plot.empty()) {
    run.log.close();
    // fsdp-plot sits next to this executable.
    const auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
    const std::string command = "'" + (self / "fsdp-plot").string() + "' '" + o.log + "' '" + o.plot + "'";
    if (std::system(command.c_str()) != 0) std::cerr << "fsdp-train: warning: plotting failed: " << command << "\n";
  }
  if (!o.trace.empty()) {
    fsdp::trace::enable(false);
    fsdp::trace::write(trace_path(o.trace, rank), rank);
    if (rank == 0) std::cout << "trace written to " << trace_path(o.trace, 0) << " (one file per rank)\n";
  }

  if (o.sample > 0) print_sample(model, o, rank, run.device);

  double save_final_s = 0.0;
  int64_t save_final_peak_extra = 0;
  if (!o.save_final.empty()) {
    const auto save_start = Clock::now();
    fsdp::memory::reset_peaks();
    const int64_t live_before = fsdp::memory::usage().live_total;
    fsdp::save_full_state_dict(state, o.save_final,
                            {{"format", "pt"}, {"model", "gpt"}, {"config", c.describe()}, {"steps", std::to_string(o.steps)}});
    save_final_peak_extra = fsdp::memory::usage().peak_total - live_before;
    save_final_s = std::chrono::duration<double>(Clock::now() - save_start).count();
  }
  if (rank == 0) {
    const double typical = median(step_times);
    std::cout << "\n== summary ==\n"
              << "final loss        " << std::fixed << std::setprecision(4) << final_loss << " after " << (preempted_after ? preempted_after : o.steps)
              << " steps" << (scaler ? " (" + std::to_string(skipped_steps) + " skipped on overflow)" : "") << "\n";
    if (final_val_loss) {
      std::cout << "validation loss   " << std::setprecision(4) << *final_val_loss << " (" << eval_sequences
                << " held-out sequences)\n";
    }
    std::cout
              << "throughput        " << std::setprecision(0) << tokens_per_step / typical << " tokens/s (median step "
              << std::setprecision(3) << typical << " s, first step excluded); wall " << std::setprecision(1)
              << elapsed << " s\n"
              << "step time split   (rank 0, medians) compute " << std::setprecision(3)
              << typical - median(exposed_comm_times) - median(optimizer_times) << " s, exposed communication "
              << median(exposed_comm_times) << " s (" << std::setprecision(1)
              << 100.0 * median(exposed_comm_times) / typical << "%), optimizer " << std::setprecision(3)
              << median(optimizer_times) << " s\n";
    if (nvme) {
      std::cout << "disk offload      (rank 0, medians) " << human_bytes(static_cast<int64_t>(median(offload_read)))
                << " read and " << human_bytes(static_cast<int64_t>(median(offload_written)))
                << " written per step (the planner: " << human_bytes(nvme_plan->io_per_step())
                << " in all); compute waited " << std::setprecision(3) << median(offload_wait_times) << " s ("
                << std::setprecision(1) << 100.0 * median(offload_wait_times) / typical << "%) on it\n";
    }
    std::cout << "per-rank memory   (exact tensor bytes from the counting allocator)\n";
    for (int r = 0; r < W; ++r) {
      const fsdp::RankFigures& f = last_figures[r];
      std::cout << "  rank " << r << ": model state " << human_bytes(f.model_state_bytes) << " (params "
                << human_bytes(f.param_shard_bytes) << ", grads " << human_bytes(f.grad_shard_bytes) << ", optimizer "
                << human_bytes(f.optimizer_state_bytes) << "), peak tensors " << human_bytes(max_peak[r]) << "\n";
    }
    std::cout << "  the planner predicted a peak of " << human_bytes(predicted_peak_bytes)
              << (nvme ? " with the offload (in memory: " : " (") << "model state "
              << human_bytes(nvme_plan ? nvme_plan->resident.total() : predicted_peak.state.total()) << ", gathered "
              << human_bytes(predicted_peak.gathered)
              << ", activations " << human_bytes(predicted_peak.activations) << ", backward transient "
              << human_bytes(predicted_peak.backward_transient) << ")\n";
    std::cout << "  full model state on one process would be " << human_bytes(16 * num_params)
              << " (16 bytes x parameters)\n";
    {
      const int64_t* rss_of = rss.data_ptr<int64_t>();
      const int64_t rss_sum = std::accumulate(rss_of, rss_of + W, int64_t{0});
      std::cout << "  peak RSS of all ranks " << human_bytes(rss_sum);
      if (run.ram_predicted > 0) {
        std::cout << "; the preflight planned " << human_bytes(run.ram_predicted * W) << " ("
                  << human_bytes(run.ram_predicted) << " a rank)";
      }
      std::cout << "\n";
    }
    if (!run.device.is_cpu()) {
      std::cout << "device memory     (" << run.device << ", the CUDA caching allocator; " << run.backend
                << " collectives" << (o.offload == "cpu" ? ", CPU offload" : "") << ")\n";
      for (int r = 0; r < W; ++r) {
        const fsdp::RankFigures& f = last_figures[r];
        std::cout << "  rank " << r << ": last step's peak " << human_bytes(f.device_peak_bytes)
                  << ", of which gathered parameters at most " << human_bytes(f.device_gathered_peak_bytes)
                  << "; model state there " << human_bytes(f.device_model_state_bytes) << " (params "
                  << human_bytes(f.device_param_shard_bytes) << ", grads " << human_bytes(f.device_grad_shard_bytes)
                  << ", optimizer " << human_bytes(f.device_optimizer_state_bytes) << ")\n";
      }
      std::cout << "  run's peak " << human_bytes(peak_device) << " allocated, " << human_bytes(peak_device_reserved)
                << " reserved (largest rank)\n";
    }
    if (!o.save_final.empty()) {
      const double mb = std::filesystem::file_size(o.save_final) / 1e6;
      std::cout << "saved final weights to " << o.save_final << " (" << std::setprecision(1) << mb << " MB in "
                << std::setprecision(2) << save_final_s << " s, " << std::setprecision(0) << mb / save_final_s
                << " MB/s; rank 0's tensor memory peaked " << human_bytes(save_final_peak_extra)
                << " above its model state while saving)\n";
    }
    if (preempted_after) {
      std::cout << "preempted         a signal (SIGTERM or SIGUSR1) reached "
                << (preemption_signal ? "this rank" : "a rank") << "; stopped after step " << preempted_after
                << (o.ckpt_dir.empty() ? ", nothing saved (no --ckpt-dir)"
                                       : ", checkpoint " + (std::filesystem::path(o.ckpt_dir) /
                                                            ("step-" + std::to_string(preempted_after))).string() +
                                             " saved: resume with --resume")
                << "; exit status " << (o.ckpt_dir.empty() ? kExitPreemptedUnsaved : kExitPreemptedSaved) << "\n";
    }
    std::cout << std::flush;
  }
  if (preempted_after) return o.ckpt_dir.empty() ? kExitPreemptedUnsaved : kExitPreemptedSaved;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::memory::install_counting_allocator();
  fsdp::MpiEnvironment mpi(&argc, &argv);
  install_preemption_handlers();
  const auto world = mpi.world();
  const int rank = world->rank();
  try {
    check_scheduler_world(world->size());
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train: error: " << fsdp::error_message(e) << "\n";
    return 1;
  }

  TrainOptions o;
  CLI::App app{"Train the reference GPT with fully sharded data parallelism. Start it through fsdp-run."};
  app.add_option("--preset", o.preset, "tiny, small, medium, large or xl")->capture_default_str();
  app.add_option("--vocab", o.vocab, "override the preset's vocabulary size");
  app.add_option("--context", o.context, "override the preset's context length");
  app.add_option("--layers", o.layers, "override the preset's number of layers");
  app.add_option("--heads", o.heads, "override the preset's number of heads");
  app.add_option("--width", o.width, "override the preset's width");
  app.add_option("--batch", o.batch, "sequences per rank per step (default: the preset's)");
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--adamw", o.adamw, "fused (fsdp::FusedAdamW: one vectorized, multi-threaded pass) or torch "
                                     "(torch::optim::AdamW); checkpoints of either resume with either")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu, or cuda (rank r of a host on its GPU r mod the GPUs it sees)")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "collectives: mpi, nccl (a GPU per rank), or auto (nccl where every rank has its own GPU)")
      ->capture_default_str();
  app.add_option("--offload", o.offload,
                 "none, or cpu: fp32 shards, gradients and optimizer state in host memory, optimizer step on the CPU "
                 "(sharded strategies)")
      ->capture_default_str();
  app.add_option("--offload-optimizer", o.offload_optimizer,
                 "none, or nvme: AdamW's moments (and the fp32 masters of bf16/fp16 parameters) in a scratch file "
                 "in --offload-dir between steps, stepped unit by unit with the reads and writes overlapped")
      ->capture_default_str();
  app.add_option("--offload-params", o.offload_params,
                 "none, or nvme: the parameter shards on disk, read before each all-gather (sharded strategies; with "
                 "bf16/fp16 parameters together with --offload-optimizer nvme)")
      ->capture_default_str();
  app.add_option("--offload-dir", o.offload_dir, "the folder of the nvme offload's scratch files (one per rank)");
  app.add_option("--offload-engine", o.offload_engine,
                 "auto (libaio with O_DIRECT where the file system takes it, else threads), libaio, or threads "
                 "(pread/pwrite)")
      ->capture_default_str();
  app.add_flag("--no-preflight", o.no_preflight,
               "skip the check that the planner's memory for this run fits the host's available memory");
  app.add_option("--seed", o.seed, "initialization seed")->capture_default_str();
  app.add_option("--data", o.data, "token file: raw bytes, or .bin of uint16 tokens (default: built-in corpus)");
  app.add_option("--data-order", o.data_order,
                 "shuffled (each sequence's start drawn from its global index) or sequential (consecutive sequences)")
      ->capture_default_str();
  app.add_option("--data-seed", o.data_seed, "seed of the shuffled data order")->capture_default_str();
  app.add_option("--val-fraction", o.val_fraction,
                 "hold out this last fraction of the data for validation, in [0, 1) (0: none)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every,
                 "compute the validation loss every K steps and after the last (0: never)")
      ->capture_default_str();
  app.add_option("--eval-sequences", o.eval_sequences,
                 "validation sequences per evaluation, a multiple of the world size (default: 64 rounded up to one)");
  app.add_option("--init-from", o.init_from, "initial weights (.safetensors, the spec's names)");
  app.add_option("--save-final", o.save_final, "write the trained weights here (.safetensors)");
  app.add_option("--log", o.log, "JSON lines, one per step");
  app.add_option("--threads", o.threads, "LibTorch threads per rank (default: from fsdp-run, else cores / ranks)");
  app.add_option("--print-every", o.print_every, "progress line interval (default: steps / 20)");
  app.add_option("--strategy", o.strategy,
                 "no_shard, zero1, shard_grad_op, full_shard, hybrid_shard, hybrid_shard_zero2, or auto")
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "hybrid strategies: ranks per (simulated) node (default: from fsdp-run, else MPI's shared-memory nodes)");
  app.add_option("--memory-budget", o.memory_budget,
                 "--strategy auto: per-rank bytes for model state plus gathered parameters "
                 "(the rule of fsdp-plan --budget)");
  app.add_option("--param-dtype", o.param_dtype, "fp32, bf16 or fp16: the dtype gathered and computed with")
      ->capture_default_str();
  app.add_option("--reduce-dtype", o.reduce_dtype, "fp32, bf16 or fp16: the dtype gradients are reduced in "
                                                   "(default: the param dtype)");
  app.add_option("--grad-accum", o.grad_accum, "micro-steps per optimizer step")->capture_default_str();
  app.add_flag("--no-sync", o.no_sync,
               "with --grad-accum: skip the reduction before the last micro-step also for sharded-gradient "
               "strategies (keeps full-size gradients between micro-steps)");
  app.add_option("--clip-grad-norm", o.clip_grad_norm, "clip the global gradient norm to this (0: off)")
      ->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, or cosine (to --min-lr at the last step); either after --warmup-steps of linear warmup")
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "steps of linear warmup from lr/warmup to --lr")
      ->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "--lr-schedule cosine: the learning rate of the last step (default: lr / 10)");
  app.add_option("--weight-decay", o.weight_decay,
                 "AdamW's decoupled weight decay, of parameters of 2 or more dimensions only")
      ->capture_default_str();
  app.add_option("--ckpt-dir", o.ckpt_dir, "directory of checkpoints (step-N sub-directories)");
  app.add_option("--ckpt-format", o.ckpt_format,
                 "sharded (each rank writes its shards) or full (rank 0 writes model and optimizer safetensors)")
      ->capture_default_str();
  app.add_option("--ckpt-every", o.ckpt_every,
                 "save a checkpoint every K steps; with --ckpt-dir one is always saved after the last step (0: only then)");
  app.add_option("--ckpt-keep", o.ckpt_keep, "keep the newest N complete checkpoints")->capture_default_str();
  app.add_flag("--resume", o.resume, "continue from the newest complete checkpoint in --ckpt-dir (if any)");
  app.add_flag("--forward-prefetch", o.forward_prefetch, "issue the next unit's all-gather before this unit's forward");
  app.add_option("--backward-prefetch", o.backward_prefetch,
                 "none, pre (before this unit's gradients) or post (after them): when backward gathers the next unit")
      ->capture_default_str();
  app.add_option("--wrap", o.wrap, "block (a unit per transformer block) or sublayer (per attention and per MLP)")
      ->capture_default_str();
  app.add_option("--prefetch-depth", o.prefetch_depth, "units ahead that prefetch gathers")->capture_default_str();
  app.add_flag("--no-limit-all-gathers", o.no_limit_all_gathers,
               "let prefetch keep more than one unused unit gathered (off: at most one)");
  app.add_flag("--no-block-cache", o.no_block_cache,
               "give every freed host buffer back at once instead of keeping six unit buffers' worth for reuse");
  app.add_flag("--sharded-init", o.sharded_init,
               "build the model without memory for its weights and initialize it unit by unit while sharding "
               "(the same weights as the default initialization)");
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "recompute each block's forward in backward instead of keeping its activations");
  app.add_option("--plot", o.plot,
                 "write DIR/loss.png and DIR/memory.png from the log after training (the log defaults to DIR/log.jsonl)");
  app.add_option("--sample", o.sample, "after training, print N tokens the model generates from --prompt (0: none)");
  app.add_option("--temperature", o.temperature, "--sample: softmax temperature (0: greedy)")->capture_default_str();
  app.add_option("--prompt", o.prompt, "--sample: the text generation starts from")->capture_default_str();
  app.add_option("--sample-seed", o.sample_seed, "--sample: seed of the sampling")->capture_default_str();
  app.add_option("--trace", o.trace,
                 "write a Chrome/Perfetto trace per rank: FILE.json becomes FILE.rank<r>.json");
  app.add_option("--summary", o.summary,
                 "write the run's figures as one JSON object (medians after the first step; per-rank lists)");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "seconds a collective may wait before the job is ended (default: FSDP_COLLECTIVE_TIMEOUT, else 600)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments, so every rank leaves here alike.
    if (rank == 0) return app.exit(e);
    return e.get_exit_code();
  }

  if (!o.plot.empty() && o.log.empty()) o.log = (std::filesystem::path(o.plot) / "log.jsonl").string();
  torch::set_num_threads(o.threads > 0 ? o.threads : default_threads(world->size()));
  if (o.collective_timeout > 0) world->set_timeout(o.collective_timeout);  // the units' groups inherit it
  Run run;
  int failed = 0;
  try {
    run = prepare(o, world);
  } catch (const std::exception& e) {
    failed = 1;
    if (rank == 0 || std::string(e.what()).find("log file") != std::string::npos)
      std::cerr << "fsdp-train: error: " << fsdp::error_message(e) << "\n";
  }
  // One rank's setup failure (its log file, say) stops every rank cleanly.
  torch::Tensor any_failed = torch::tensor({failed}, torch::kInt);
  world->all_reduce(any_failed, fsdp::ReduceOp::kSum)->wait();
  if (any_failed.item<int>() > 0) return 1;

  try {
    return train(o, run, world);
  } catch (const std::exception& e) {
    // Ranks that fail alike print one message; MPI then ends the job.
    std::cout << std::flush;
    fsdp::MpiEnvironment::abort_with_message("fsdp-train: error: " + fsdp::error_message(e));
  }
}
