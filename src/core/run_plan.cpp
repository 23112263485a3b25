// One run's plan (fsdp/run_plan.h): the memory planner's estimates
// (memory_plan.cpp) put together for one run, in the one place that decides
// which of them apply.

#include "fsdp/run_plan.h"

#include <algorithm>
#include <numeric>

namespace fsdp {

int64_t ModelDescription::num_parameters() const {
  return std::accumulate(layer_units.begin(), layer_units.end(), int64_t{0});
}

RunPlan plan_run(const ModelDescription& model, bool sublayer, const FullyShardOptions& options,
                 const RunSettings& settings) {
  RunPlan plan;
  const int world = settings.world;
  const ShardingStrategy strategy = options.strategy();
  const MixedPrecision& mp = options.mixed_precision();
  TORCH_CHECK(world > 0, "plan_run: the world must have a rank, got ", world);
  TORCH_CHECK(!model.units(sublayer).empty(), "plan_run: the model describes no ", sublayer ? "sublayer" : "layer",
              " units");
  plan.strategy = strategy;
  plan.unit_numels = model.units(sublayer);
  plan.ranks_per_node = settings.ranks_per_node > 0 ? settings.ranks_per_node : world;
  plan.shard_group = shard_group_size(strategy, world, plan.ranks_per_node);
  const std::vector<int64_t>& units = plan.unit_numels;

  TransformerShape shape = model.shape;
  shape.sublayer_units = sublayer;
  const bool prefetch = options.forward_prefetch() || options.backward_prefetch() != BackwardPrefetch::kNone;
  plan.peak = estimate_step_peak(shape, strategy, world, plan.ranks_per_node, mp, prefetch,
                                 options.activation_checkpointing(), units, options.zero_plus_plus());
  if (settings.gathers_run_ahead && !keeps_params_unsharded(strategy)) {
    const int64_t K = plan.shard_group;
    int64_t largest = 0;  // padded, the root's aside
    for (size_t u = 1; u < units.size(); ++u) largest = std::max(largest, (units[u] + K - 1) / K * K);
    plan.peak.gathered += largest * static_cast<int64_t>(c10::elementSize(mp.param_dtype()));
  }
  if (const auto& nvme = options.nvme_offload()) {
    const bool in_backward = nvme_steps_in_backward(nvme->step_in_backward(), strategy, settings.clips_gradients,
                                                    settings.scales_loss);
    plan.nvme = estimate_nvme_offload(units, strategy, world, plan.shard_group, mp, nvme->optimizer_state(),
                                      nvme->params(), settings.micro_steps, int64_t{1} << 20, in_backward,
                                      nvme->read_ahead());
  }
  plan.step_peak = plan.nvme ? peak_with_nvme_offload(plan.peak, *plan.nvme) : plan.peak.total();
  plan.comm = estimate_comm_per_step(units, strategy, world, plan.ranks_per_node, mp, options.zero_plus_plus());
  if (settings.async_checkpoint) {
    plan.staging = estimate_checkpoint_staging(units, strategy, world, plan.shard_group, settings.full_checkpoint);
  }
  return plan;
}

}  // namespace fsdp
