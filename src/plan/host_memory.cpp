// Host-memory planning: what the host has, what a run needs, the preflight.

#include "plan/host_memory.h"

#include "fsdp/offload.h"
#include "base/strings.h"
#include "core/host_resources.h"
#include "core/strategy_rules.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>

namespace fsdp {
namespace {

// What the host block cache holds at a disk-offloaded run's peak, beside
// the tensors: one padded unit (fp32), the largest, freed by one gather
// before the next takes it. Not the cache's limit (fsdp::host_block_cache_limit,
// three): measured with both offloads, W = 4, the last step's reserved
// peak exceeded its tensor peak by 0.9 padded units at 3b, and the ranks'
// RSS by about 1.1 at xl.
int64_t nvme_block_cache(const std::vector<int64_t>& unit_numels, int shard_group) {
  int64_t largest = 0;
  for (int64_t n : unit_numels) largest = std::max(largest, (n + shard_group - 1) / shard_group * shard_group);
  return largest * static_cast<int64_t>(sizeof(float));
}

}  // namespace

namespace {

// This host's ranks: RunSettings::ranks_here, one at least.
int ranks_here(const PlannedRun& run) { return std::max(1, run.settings.ranks_here); }

// `run`'s plan on this host (its ranks give the node size where none is set).
RunPlan plan_here(const PlannedRun& run) {
  PlannedRun here = run;
  here.settings.ranks_here = ranks_here(run);
  return plan_run(here);
}

// `run` with the disk offload of the optimizer state and the parameters as
// asked (both false: none), the rest of the offload's options kept.
PlannedRun with_disk_offload(PlannedRun run, bool optimizer_state, bool params) {
  if (!optimizer_state && !params) {
    if (run.options.offload().nvme_options()) run.options.offload(OffloadPolicy());  // a CPU offload stays
    return run;
  }
  NvmeOffloadOptions nvme = run.options.offload().nvme_options().value_or(NvmeOffloadOptions(""));
  run.options.offload(OffloadPolicy::nvme(nvme.optimizer_state(optimizer_state).params(params)));
  return run;
}

}  // namespace

int64_t host_memory_needed(const RunPlan& plan, bool sharded_init) {
  const std::vector<int64_t>& units = plan.unit_numels;
  const std::vector<int64_t>& frozen = plan.frozen_numels;
  const int64_t params = std::accumulate(units.begin(), units.end(), int64_t{0}) +
                         std::accumulate(frozen.begin(), frozen.end(), int64_t{0});
  // The largest flat buffer: a unit's trainable part or its frozen part, each flattened on its own.
  int64_t largest = *std::max_element(units.begin(), units.end());
  if (!frozen.empty()) largest = std::max(largest, *std::max_element(frozen.begin(), frozen.end()));
  int64_t step = plan.step_peak;
  if (plan.nvme) step += nvme_block_cache(units, plan.shard_group);
  // Building the whole model on every rank, then flattening its largest
  // unit; sharded, a unit at a time (disk offload moves each unit's shard
  // out before the next is built), less than a step holds.
  const int64_t construction = sharded_init ? 0 : 4 * (params + largest);
  step += plan.staging.per_rank;  // a staging copy beside every step until its background write ends
  return std::max(step, construction) + kHostRuntimeBytes;
}

int64_t host_memory_needed(const PlannedRun& run) {
  return host_memory_needed(plan_here(run), run.settings.sharded_init);
}

int64_t reduce_scatter_root_bytes(const RunPlan& plan, const MixedPrecision& mixed_precision) {
  if (plan.comm.reduce_scatter == 0 || plan.shard_group < 2) return 0;
  // The largest unit's gradient, padded to the shard group, the root's
  // included: where a vocabulary makes the root the largest unit, its
  // reduction may come at a lower point of the step, but it is not measured.
  const int64_t K = plan.shard_group;
  int64_t largest = 0;
  for (int64_t n : plan.unit_numels) largest = std::max(largest, (n + K - 1) / K * K);
  return 2 * largest * static_cast<int64_t>(c10::elementSize(mixed_precision.effective_reduce_dtype()));
}

HostMemoryNeed host_memory_need(const PlannedRun& run) {
  const RunPlan plan = plan_here(run);
  const int64_t root_bytes = reduce_scatter_root_bytes(plan, run.options.mixed_precision());
  const int64_t rank0_staging = plan.staging.rank0 - plan.staging.per_rank;
  // The shard groups' first ranks this host may hold: its ranks over the
  // group's size, rounded up (a host's ranks may start a group and end
  // another), and one at least (which of the hosts holds the first rank of
  // a group that spans hosts is not known here).
  const int64_t K = plan.shard_group;
  const int64_t group_firsts = std::max<int64_t>(1, (ranks_here(run) + K - 1) / K);
  HostMemoryNeed need;
  need.per_rank = host_memory_needed(plan, run.settings.sharded_init);
  need.reduce_scatter_buffers = group_firsts * root_bytes;
  need.host = need.per_rank * ranks_here(run) + rank0_staging + need.reduce_scatter_buffers;
  need.all_ranks = need.per_rank * run.settings.world + rank0_staging + run.settings.world / K * root_bytes;
  return need;
}

std::vector<HostMemoryVariant> host_memory_variants(const PlannedRun& run) {
  const auto& nvme = run.options.offload().nvme_options();
  const bool nvme_optimizer = nvme && nvme->optimizer_state(), nvme_params = nvme && nvme->params();
  // Each change on top of the one before.
  PlannedRun sharded_init = run;
  sharded_init.settings.sharded_init = true;
  PlannedRun recomputed = sharded_init;
  recomputed.options.activation_checkpointing(true);
  PlannedRun sublayer = recomputed;
  sublayer.settings.sublayer_units = true;
  std::vector<HostMemoryVariant> variants = {
      {"--sharded-init", sharded_init},
      {"--sharded-init --activation-checkpointing", recomputed},
      {"--sharded-init --activation-checkpointing --wrap sublayer", sublayer},
      {"--sharded-init --activation-checkpointing --offload-optimizer nvme", with_disk_offload(recomputed, true, nvme_params)}};
  const bool shardable = !keeps_params_unsharded(run.options.strategy());
  if (shardable && (run.options.mixed_precision().param_dtype() == torch::kFloat || nvme_optimizer)) {
    variants.push_back({"--sharded-init --activation-checkpointing --offload-optimizer nvme --offload-params nvme",
                        with_disk_offload(recomputed, true, true)});
  }
  return variants;
}

int fitting_read_ahead(const PlannedRun& run, int64_t available) {
  const auto& nvme = run.options.offload().nvme_options();
  if (!nvme || !(nvme->optimizer_state() || nvme->params())) return 0;
  const int asked = nvme->read_ahead();
  PlannedRun shallower = run;
  for (int depth = asked; depth >= 1; --depth) {
    shallower.options.offload(OffloadPolicy::nvme(NvmeOffloadOptions(*nvme).read_ahead(depth)));
    if (host_memory_need(shallower).host <= available) return depth;
  }
  return asked;
}

HostMemoryNeed preflight_host_memory(const PlannedRun& run, int64_t available) {
  const HostMemoryNeed need = host_memory_need(run);
  const int64_t needed = need.per_rank;
  if (need.host <= available) return need;
  std::ostringstream alternatives;
  bool any = false;
  for (const auto& v : host_memory_variants(run)) {
    const HostMemoryNeed n = host_memory_need(v.run);
    alternatives << "\n  " << v.flags << ": " << format_mib(n.per_rank) << " per rank, " << format_mib(n.host)
                 << (n.host <= available ? " (fits)" : " (does not fit)");
    any = any || n.host <= available;
  }
  TORCH_CHECK(false, "preflight: this run needs about ", format_mib(needed), " per rank on the host (the planner's step peak",
              run.settings.sharded_init ? "" : " or the whole model each rank builds first", ", plus ",
              format_mib(kHostRuntimeBytes), " of runtime", run.settings.async_checkpoint ? ", and the asynchronous checkpoints' staging" : "",
              "), ", ranks_here(run), " rank(s) here",
              need.reduce_scatter_buffers > 0 ? " and MPI's reduce-scatter buffers (" + format_mib(need.reduce_scatter_buffers) + ")" : "",
              ": ", format_mib(need.host),
              ", but the host has ", format_mib(available), " available. With other settings:", alternatives.str(),
              any ? "" : "\n  none fits: fewer ranks on this host, a smaller --batch or --context, or bf16 parameters",
              "\n(fsdp-plan gives the whole table; --no-preflight runs anyway)");
}

int64_t preflight_scratch_space(const PlannedRun& run, int64_t free_bytes) {
  const RunPlan plan = plan_here(run);
  if (!plan.nvme) return 0;
  const int64_t needed = plan.nvme->file_bytes * ranks_here(run);
  TORCH_CHECK(needed <= free_bytes, "preflight: the disk offload's scratch files need ", needed, " bytes (",
              format_mib(needed), ": ", plan.nvme->file_bytes, " bytes a rank, ", ranks_here(run),
              " rank(s) here) in '", run.options.offload().nvme_options()->store().dir(), "', which has ", free_bytes, " bytes (",
              format_mib(free_bytes), ") free: free space there, give another --offload-dir, or offload less");
  return needed;
}

}  // namespace fsdp
