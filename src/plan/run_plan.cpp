// One run's plan (fsdp/run_plan.h): the memory planner's estimates
// (memory_plan.cpp) put together for one run, in the one place that decides
// which of them apply.

#include "fsdp/run_plan.h"
#include "plan/estimates.h"
#include "core/strategy_rules.h"
#include "core/loss_scaling.h"

#include <algorithm>
#include <numeric>
#include <optional>

namespace fsdp {


RunPlan plan_run(const PlannedRun& run) {
  const ModelDescription& model = run.model;
  const FullyShardOptions& options = run.options;
  const RunSettings& settings = run.settings;
  const bool sublayer = settings.sublayer_units;
  RunPlan plan;
  const int world = settings.world;
  const ShardingStrategy strategy = options.strategy();
  const MixedPrecision& mp = options.mixed_precision();
  TORCH_CHECK(world > 0, "plan_run: the world must have a rank, got ", world);
  TORCH_CHECK(!model.units(sublayer).empty(), "plan_run: the model describes no ", sublayer ? "sublayer" : "layer",
              " units");
  plan.strategy = strategy;
  plan.zero_plus_plus = options.zero_plus_plus();
  plan.world = world;
  plan.unit_numels = model.units(sublayer);
  plan.frozen_numels = model.frozen(sublayer);
  plan.nf4_numels = model.nf4(sublayer);
  // No node size given: this host's ranks where they divide the world (as
  // fully_shard splits), else the world on one host.
  const int here = settings.ranks_here;
  plan.ranks_per_node = settings.ranks_per_node > 0 ? settings.ranks_per_node
                                                    : (here > 0 && world % here == 0 ? here : world);
  plan.shard_group = shard_group_size(strategy, world, plan.ranks_per_node);
  const std::vector<int64_t>& units = plan.unit_numels;
  const std::vector<int64_t>& frozen = plan.frozen_numels;

  TransformerShape shape = model.shape;
  shape.sublayer_units = sublayer;
  const bool prefetch = options.forward_prefetch() || options.backward_prefetch() != BackwardPrefetch::kNone;
  plan.peak = estimate_step_peak(shape, strategy, world, plan.ranks_per_node, mp, prefetch,
                                 options.activation_checkpointing(), units, options.zero_plus_plus(), frozen,
                                 plan.nf4_numels);
  if (settings.gathers_run_ahead && !keeps_params_unsharded(strategy)) {
    const int64_t K = plan.shard_group;
    int64_t largest = 0;  // padded, the root's aside, with its frozen part
    for (size_t u = 1; u < units.size(); ++u) {
      const int64_t frozen_part = frozen.empty() ? 0 : (frozen[u] + K - 1) / K * K;
      largest = std::max(largest, (units[u] + K - 1) / K * K + frozen_part);
    }
    plan.peak.gathered += largest * static_cast<int64_t>(c10::elementSize(mp.param_dtype()));
  }
  if (const auto& nvme = options.offload().nvme_options()) {
    const NvmeStepSchedule schedule =
        nvme_step_schedule(*nvme, strategy, settings.clips_gradients, settings.scales_loss);
    const bool in_backward = schedule == NvmeStepSchedule::kInBackward;
    const bool before_gather = schedule == NvmeStepSchedule::kBeforeNextGather;
    plan.nvme = estimate_nvme_offload(units, strategy, world, plan.shard_group, mp, nvme->optimizer_state(),
                                      nvme->params(), settings.micro_steps, int64_t{1} << 20, in_backward,
                                      nvme->read_ahead(), before_gather, nvme->gradient_slots(), frozen);
  }
  plan.step_peak = plan.nvme ? peak_with_nvme_offload(plan.peak, *plan.nvme) : plan.peak.total();
  plan.comm =
      estimate_comm_per_step(units, strategy, world, plan.ranks_per_node, mp, options.zero_plus_plus(), frozen,
                             plan.nf4_numels);
  if (settings.async_checkpoint) {
    plan.staging =
        estimate_checkpoint_staging(units, strategy, world, plan.shard_group, settings.full_checkpoint, 8, frozen);
  }
  return plan;
}

namespace {

// Ring collectives over k ranks: an all-gather or reduce-scatter of a full
// buffer of `bytes` moves (k-1)/k of it over each link, in k-1 steps; an
// all-reduce twice that.
double ring_seconds(double bytes, int64_t k, double bandwidth, double latency, double passes) {
  if (k <= 1) return 0.0;
  return passes * ((k - 1.0) / k * bytes / bandwidth + (k - 1) * latency);
}

// With the step's collectives measured on these hosts (fsdp-plan calibrate
// --preset --ranks-per-node, the same world and hosts). The measured rates
// carry what the counters leave out: OpenMPI's algorithms (4 ranks on 2
// hosts: recursive doubling for the all-gather, which sends the whole buffer
// across each way where a ring sends 3/4 of it; MPI_Reduce_scatter_block as
// a reduce to rank 0 and a scatter, which sends the whole buffer across
// twice into rank 0's host), both ranks of a host sharing its link, and TCP
// under the cap.
std::optional<StepTime> measured_step_time(const RunPlan& plan, const ClusterDescription& c, double compute) {
  const int nodes = plan.world / plan.ranks_per_node;
  if (!c.collectives || c.collectives->world != plan.world || c.collectives->ranks_per_node != plan.ranks_per_node ||
      nodes < 2 || keeps_params_unsharded(plan.strategy)) {
    return std::nullopt;
  }
  const ClusterDescription::MeasuredCollectives& r = *c.collectives;
  const CommBytes& b = plan.comm;
  const ZeroPlusPlus& z = plan.zero_plus_plus;
  StepTime t;
  double blocking = 0;  // communication the engine waits on in place: nothing hides it
  if (is_hybrid(plan.strategy)) {
    // The shard's all-reduce across hosts runs when a unit's reduction is
    // finished, and backward waits for it there (FlatParam's finish).
    blocking = b.all_reduce / r.all_reduce_cross_host;
    t.comm = b.all_gather / r.all_gather_host + b.reduce_scatter / r.reduce_scatter_host + blocking;
  } else {
    const bool qgz = z.gradient_quantization() != Quantization::kNone;
    const double rs_world = qgz ? 0.0 : static_cast<double>(b.reduce_scatter);
    const double rs_host = qgz ? static_cast<double>(b.reduce_scatter) : 0.0;
    const double gather_world = static_cast<double>(b.cross_host - b.all_to_all) - rs_world;
    const double gather_host = static_cast<double>(b.all_gather) - gather_world;
    const double world_rate = z.gather_quantization() != Quantization::kNone ? r.all_gather_world_int8 : r.all_gather_world;
    t.comm = gather_world / world_rate + gather_host / r.all_gather_host + rs_world / r.reduce_scatter_world +
             rs_host / r.reduce_scatter_host + b.all_to_all / r.all_to_all_cross_host;
  }
  t.step = compute + t.comm - r.overlap * std::min(compute, t.comm - blocking);
  t.efficiency = compute / t.step;
  return t;
}

// Ring collectives over the links, overlapped with compute but the first unit's gather.
StepTime ring_step_time(const RunPlan& plan, const ClusterDescription& c, double compute) {
  const int world = plan.world, per_node = plan.ranks_per_node, nodes = world / per_node;
  const int64_t n_units = static_cast<int64_t>(plan.unit_numels.size());
  const int64_t K = plan.shard_group;
  const bool across_nodes = K > per_node || (!is_hybrid(plan.strategy) && nodes > 1);
  const double bw = across_nodes ? c.inter_bandwidth : c.intra_bandwidth;
  const double lat = across_nodes ? c.inter_latency : c.intra_latency;
  StepTime t;
  t.comm = ring_seconds(plan.comm.all_gather, K, bw, lat / n_units, 1.0) +
           ring_seconds(plan.comm.reduce_scatter, K, bw, lat / n_units, 1.0);
  if (plan.strategy == ShardingStrategy::kNoShard || plan.strategy == ShardingStrategy::kZero1) {
    t.comm += ring_seconds(plan.comm.all_reduce, world, nodes > 1 ? c.inter_bandwidth : c.intra_bandwidth,
                           nodes > 1 ? c.inter_latency : c.intra_latency, 2.0);
  } else if (plan.comm.all_reduce > 0) {
    t.comm += ring_seconds(plan.comm.all_reduce, nodes, c.inter_bandwidth, c.inter_latency, 2.0);
  }
  const double first_gather =
      ring_seconds(static_cast<double>(plan.comm.all_gather) / std::max<int64_t>(1, n_units), K, bw, lat, 1.0);
  t.step = std::max(compute, t.comm) + (plan.comm.all_gather > 0 ? first_gather : 0.0);
  t.efficiency = compute / t.step;
  return t;
}

}  // namespace

StepTime estimate_step_time(const RunPlan& plan, const ClusterDescription& cluster, double compute_seconds) {
  if (auto measured = measured_step_time(plan, cluster, compute_seconds)) return *measured;
  return ring_step_time(plan, cluster, compute_seconds);
}

}  // namespace fsdp
