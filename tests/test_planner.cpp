// The planner's figures for ZeRO++'s options and for disk offload stepping in backward (fsdp/memory_plan.h),
// bytes worked out by hand for two small units, so that a formula that
// changes fails here before a run's counters (ZeroPlusPlus.* in mpi_tests)
// disagree with it. Units of 1000 and 300 elements over 4 ranks, 2 hosts of
// 2 ranks, fp32, blocks of 256: the shards are 250 and 75 elements, each
// packing to one block, 256 + 4 = 260 bytes.

#include <gtest/gtest.h>

#include "fsdp/device_choice.h"
#include "fsdp/lora.h"
#include "plan/estimates.h"
#include "fsdp/model_config.h"
#include "fsdp/run_plan.h"
#include "test_helpers.h"
#include "core/cpu_features.h"
#include "core/strategy_rules.h"

#include <string>
#include <vector>

namespace {

using fsdp::ShardingStrategy;
using fsdp::Quantization;
using fsdp::ZeroPlusPlus;

const std::vector<int64_t> kUnits = {1000, 300};
constexpr int kWorld = 4, kHostRanks = 2;

fsdp::CommBytes planned(ShardingStrategy s, const ZeroPlusPlus& z, int ranks_per_node = kHostRanks,
                        const fsdp::MixedPrecision& mp = fsdp::MixedPrecision()) {
  return fsdp::estimate_comm_per_step(kUnits, s, kWorld, ranks_per_node, mp, z);
}
// Blocks of 256 whatever the default: the figures below are worked out for them.
ZeroPlusPlus blocks_of_256() { return ZeroPlusPlus().quantization_block(256); }
ZeroPlusPlus qwz() { return blocks_of_256().gather_quantization(Quantization::kInt8); }
ZeroPlusPlus hpz() { return blocks_of_256().secondary_partition(true); }
ZeroPlusPlus qgz() { return blocks_of_256().gradient_quantization(Quantization::kInt8); }
ZeroPlusPlus all_three() { return qwz().secondary_partition(true).gradient_quantization(Quantization::kInt8); }

struct Expected {
  int64_t all_gather, reduce_scatter, all_reduce, all_to_all, cross_host;
};
void expect_bytes(const fsdp::CommBytes& b, const Expected& e) {
  EXPECT_EQ(b.all_gather, e.all_gather);
  EXPECT_EQ(b.reduce_scatter, e.reduce_scatter);
  EXPECT_EQ(b.all_reduce, e.all_reduce);
  EXPECT_EQ(b.all_to_all, e.all_to_all);
  EXPECT_EQ(b.cross_host, e.cross_host);
  EXPECT_EQ(b.inside_host(), b.total() - e.cross_host);
}

}  // namespace

// Plain full_shard: two fp32 gathers of 1300 elements and one reduce-scatter,
// all over the world, so all of it crosses hosts; on one host none does.
TEST(Planner, FullShardCrossesHostsWithEverything) {
  expect_bytes(planned(ShardingStrategy::kFullShard, ZeroPlusPlus()), {10400, 5200, 0, 0, 15600});
  expect_bytes(planned(ShardingStrategy::kFullShard, ZeroPlusPlus(), 0), {10400, 5200, 0, 0, 0});
  expect_bytes(planned(ShardingStrategy::kFullShard, ZeroPlusPlus(), kWorld), {10400, 5200, 0, 0, 0});
  // The hybrids: only the shard's all-reduce (500 + 150 elements) crosses.
  expect_bytes(planned(ShardingStrategy::kHybridShard, ZeroPlusPlus()), {10400, 5200, 2600, 0, 2600});
  expect_bytes(planned(ShardingStrategy::kNoShard, ZeroPlusPlus()), {0, 0, 5200, 0, 5200});
  expect_bytes(planned(ShardingStrategy::kZero1, ZeroPlusPlus()), {5200, 0, 5200, 0, 10400});
}

// qwZ: each gather moves 4 ranks x 260 packed bytes per unit instead of 4 B per element.
TEST(Planner, QuantizedGathersMoveThePackedBlocks) {
  expect_bytes(planned(ShardingStrategy::kFullShard, qwz()), {4 * 1040, 5200, 0, 0, 4 * 1040 + 5200});
  expect_bytes(planned(ShardingStrategy::kShardGradOp, qwz()), {2 * 1040, 5200, 0, 0, 2 * 1040 + 5200});
  // Blocks of 64: the 75-element shard packs to 2 blocks, 128 + 8 bytes;
  // the 250-element one to 4, 256 + 16.
  expect_bytes(planned(ShardingStrategy::kFullShard, qwz().quantization_block(64)),
               {2 * 4 * (272 + 136), 5200, 0, 0, 2 * 4 * (272 + 136) + 5200});
  // hybrid_shard gathers over its 2 ranks (shards of 500 and 150: 2 + 1
  // blocks), inside the host.
  expect_bytes(planned(ShardingStrategy::kHybridShard, qwz()), {2 * 2 * (520 + 260), 5200, 2600, 0, 2600});
}

// hpZ: backward's gather is over the host, whole fp32 (never quantized).
TEST(Planner, SecondaryPartitionKeepsBackwardsGatherInsideTheHost) {
  expect_bytes(planned(ShardingStrategy::kFullShard, hpz()), {10400, 5200, 0, 0, 5200 + 5200});
  expect_bytes(planned(ShardingStrategy::kFullShard, hpz().gather_quantization(Quantization::kInt8)),
               {2 * 1040 + 5200, 5200, 0, 0, 2 * 1040 + 5200});
  // bf16 parameters (and reductions): half of every plain figure.
  expect_bytes(planned(ShardingStrategy::kFullShard, hpz(), kHostRanks,
                       fsdp::MixedPrecision().param_dtype(c10::ScalarType::BFloat16)),
               {5200, 2600, 0, 0, 2600 + 2600});
}

// qgZ: the whole gradient reduce-scattered inside the host, then 2 hosts x
// 260 packed bytes per unit exchanged across them.
TEST(Planner, QuantizedGradientsCrossHostsAsPackedBlocks) {
  expect_bytes(planned(ShardingStrategy::kFullShard, qgz()), {10400, 5200, 0, 2 * 520, 10400 + 2 * 520});
  expect_bytes(planned(ShardingStrategy::kShardGradOp, qgz()), {5200, 5200, 0, 2 * 520, 5200 + 2 * 520});
  // Padding: 1001 elements shard to 251 (Np = 1004).
  const auto padded = fsdp::estimate_comm_per_step({1001}, ShardingStrategy::kFullShard, kWorld, kHostRanks,
                                                   fsdp::MixedPrecision(), qgz());
  expect_bytes(padded, {2 * 1004 * 4, 1004 * 4, 0, 2 * 260, 2 * 1004 * 4 + 2 * 260});
  // One host: the all-to-all is over a group of one, and nothing crosses.
  expect_bytes(planned(ShardingStrategy::kFullShard, all_three(), 0), {2 * 1040 + 5200, 5200, 0, 2 * 260, 0});
}

// All three: the quantized forward gathers and the all-to-all cross hosts,
// under a fifth of plain full_shard's bytes (the goal), here 3120 of 15600.
TEST(Planner, AllThreeTogether) {
  const auto b = planned(ShardingStrategy::kFullShard, all_three());
  expect_bytes(b, {2 * 1040 + 5200, 5200, 0, 2 * 520, 2 * 1040 + 2 * 520});
  EXPECT_EQ(b.inside_host(), 5200 + 5200);
}

// The secondary partition's memory: every unit's host slice (1000 / 2 and
// 300 / 2 fp32 elements) on top of full_shard's peak; qwZ's packed buffers
// (the largest unit's packed shard and 4 packed rows) in the gathered figure.
TEST(Planner, SecondaryPartitionMemoryIsEveryUnitsHostSlice) {
  fsdp::TransformerShape shape{64, 16, 1, 2, 8, 2};
  auto peak = [&](const ZeroPlusPlus& z) {
    return fsdp::estimate_step_peak(shape, ShardingStrategy::kFullShard, kWorld, kHostRanks, fsdp::MixedPrecision(),
                                    true, false, kUnits, z);
  };
  const fsdp::StepPeak plain = peak(ZeroPlusPlus()), with_hpz = peak(hpz()), with_qwz = peak(qwz());
  EXPECT_EQ(plain.secondary_partition, 0);
  EXPECT_EQ(with_hpz.secondary_partition, (500 + 150) * 4);
  EXPECT_EQ(with_hpz.total(), plain.total() + (500 + 150) * 4);
  EXPECT_EQ(with_qwz.gathered, plain.gathered + 5 * 260);
  // One host of all 4 ranks: a quarter of each unit.
  const auto one_host = fsdp::estimate_step_peak(shape, ShardingStrategy::kFullShard, kWorld, 0,
                                                 fsdp::MixedPrecision(), true, false, kUnits, hpz());
  EXPECT_EQ(one_host.secondary_partition, (250 + 75) * 4);
}

// The planner refuses what fully_shard refuses, with its reasons.
TEST(Planner, RefusesWhatFullyShardRefuses) {
  auto refusal = [](ShardingStrategy s, const ZeroPlusPlus& z) -> std::string {
    try {
      fsdp::estimate_comm_per_step(kUnits, s, kWorld, kHostRanks, fsdp::MixedPrecision(), z);
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  EXPECT_NE(refusal(ShardingStrategy::kNoShard, qwz()).find("need a sharded strategy"), std::string::npos);
  EXPECT_NE(refusal(ShardingStrategy::kZero1, qgz()).find("need a sharded strategy"), std::string::npos);
  EXPECT_NE(refusal(ShardingStrategy::kShardGradOp, hpz()).find("secondary_partition (hpZ) needs full_shard"),
            std::string::npos);
  EXPECT_NE(refusal(ShardingStrategy::kHybridShard, hpz()).find("secondary_partition (hpZ) needs full_shard"),
            std::string::npos);
  EXPECT_NE(refusal(ShardingStrategy::kHybridShardZero2, qgz()).find("gradient_quantization (qgZ) needs"),
            std::string::npos);
  EXPECT_NE(refusal(ShardingStrategy::kFullShard, qwz().quantization_block(6)).find("multiple of 4"),
            std::string::npos);
  EXPECT_EQ(refusal(ShardingStrategy::kFullShard, all_three()), "");
  EXPECT_THROW(fsdp::estimate_comm_per_step(kUnits, ShardingStrategy::kFullShard, kWorld, 3, fsdp::MixedPrecision(),
                                            hpz()),
               c10::Error);
}

// Disk offload stepping in backward (NvmeStepSchedule::kInBackward), fp32,
// both offloads, units of 1000 and 300 over 4 ranks (shards S = 250 and 75):
// no gradient shard stays (4 x 325 bytes less resident); full_shard's second
// gather of each unit reads the master the step then updates, so the step
// reads 4S less per unit; the state of read_ahead + 1 units (12S each: master
// and moments) and the stepping unit's gradient (4S, the largest) are in
// memory during backward, and a gather holds 1 + read_ahead units' shards.
TEST(Planner, DiskOffloadSteppingInBackward) {
  const fsdp::MixedPrecision fp32;
  const auto after = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true);
  const auto during = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true, 1,
                                                  int64_t{1} << 20, /*step_in_backward=*/true, /*read_ahead=*/1);
  EXPECT_EQ(after.resident.grads, 4 * 325);
  EXPECT_EQ(during.resident.grads, 0);
  EXPECT_EQ(after.read_per_step, 12 * 325 + 2 * 4 * 325);  // the step's state, two gathers
  EXPECT_EQ(during.read_per_step, after.read_per_step - 4 * 325);
  EXPECT_EQ(during.written_per_step, after.written_per_step);
  EXPECT_EQ(after.step_buffers, 12 * 325);           // three units at most: both here
  EXPECT_EQ(during.step_buffers, 12 * 325 + 4 * 250);  // read_ahead + 1 = 2 units: both here, and a gradient
  EXPECT_EQ(during.gather_buffers, 4 * 325);         // 1 + read_ahead units
  // The file holds a gradient slot per unit (a 1 MiB block each) unless
  // NvmeOffloadOptions::gradient_slots is off: each gradient is still freed as its unit steps.
  const auto unslotted = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true,
                                                     1, int64_t{1} << 20, true, 1, false, /*gradient_slots=*/false);
  EXPECT_EQ(during.file_bytes, after.file_bytes + 2 * (int64_t{1} << 20));
  EXPECT_EQ(unslotted.file_bytes, after.file_bytes);
  EXPECT_EQ(unslotted.resident.grads, 0);
  // A third unit (S = 50) is not held: read_ahead + 1 = 2, the largest.
  const auto three = fsdp::estimate_nvme_offload({1000, 300, 200}, ShardingStrategy::kFullShard, kWorld, 0, fp32, true,
                                                 true, 1, int64_t{1} << 20, true, 1);
  EXPECT_EQ(three.step_buffers, 12 * 325 + 4 * 250);
  // The zero2 kinds gather once, in forward: nothing to share.
  const auto zero2 = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kShardGradOp, kWorld, 0, fp32, true, true, 1,
                                                 int64_t{1} << 20, true, 1);
  EXPECT_EQ(zero2.read_per_step, 12 * 325 + 4 * 325);
  // The peak: during backward the step's buffers add to it; after, the larger one counts.
  fsdp::StepPeak peak;
  peak.state = after.resident;
  peak.activations = 100000;
  EXPECT_EQ(fsdp::peak_with_nvme_offload(peak, during),
            peak.total() - peak.state.total() + during.resident.total() + during.gather_buffers + during.step_buffers);
  EXPECT_EQ(fsdp::peak_with_nvme_offload(peak, after),
            peak.total() - peak.state.total() + after.resident.total() + after.gather_buffers);
}

// When the units step (fsdp::nvme_step_schedule, the rule NvmeOffload and
// plan_run both ask): in backward where nothing needs every gradient first;
// before the next gather where the step clips or scales the loss and the
// file has gradient slots; otherwise, or where the strategy keeps whole
// gradients, or where it was not asked for, after backward.
TEST(Planner, DiskOffloadStepSchedule) {
  using fsdp::NvmeStepSchedule;
  const auto asked = fsdp::NvmeOffloadOptions("/tmp").step_in_backward(true);
  const auto schedule = [](const fsdp::NvmeOffloadOptions& nvme, ShardingStrategy strategy, bool clips, bool scales) {
    return fsdp::nvme_step_schedule(nvme, strategy, clips, scales);
  };
  EXPECT_EQ(schedule(asked, ShardingStrategy::kFullShard, false, false), NvmeStepSchedule::kInBackward);
  EXPECT_EQ(schedule(asked, ShardingStrategy::kShardGradOp, false, false), NvmeStepSchedule::kInBackward);
  EXPECT_EQ(schedule(asked, ShardingStrategy::kFullShard, true, false), NvmeStepSchedule::kBeforeNextGather);
  EXPECT_EQ(schedule(asked, ShardingStrategy::kHybridShard, false, true), NvmeStepSchedule::kBeforeNextGather);
  EXPECT_EQ(schedule(fsdp::NvmeOffloadOptions(asked).gradient_slots(false), ShardingStrategy::kFullShard, true, false),
            NvmeStepSchedule::kAfterBackward);
  EXPECT_EQ(schedule(fsdp::NvmeOffloadOptions(asked).step_in_backward(false), ShardingStrategy::kFullShard, false,
                     false),
            NvmeStepSchedule::kAfterBackward);
  for (const auto whole : {ShardingStrategy::kNoShard, ShardingStrategy::kZero1}) {
    EXPECT_EQ(schedule(asked, whole, false, false), NvmeStepSchedule::kAfterBackward);
    EXPECT_EQ(schedule(asked, whole, true, false), NvmeStepSchedule::kAfterBackward);
  }
}

// Disk offload stepping before the next gather (a clipped or loss-scaled
// step: NvmeStepSchedule::kBeforeNextGather), same units: each gradient is
// written out in backward and read back for its unit's update (4S each way,
// a gradient slot of its own in the file), the first forward gather sends
// the master that update wrote (4S less read), no gradient shard stays;
// forward holds read_ahead units' state with their gradients (16S), and
// backward the two gradients being written out (4S each), not both at once.
TEST(Planner, DiskOffloadSteppingBeforeTheNextGather) {
  const fsdp::MixedPrecision fp32;
  const auto after = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true);
  const auto before = fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true, 1,
                                                  int64_t{1} << 20, false, /*read_ahead=*/1,
                                                  /*step_before_next_gather=*/true);
  EXPECT_EQ(before.resident.grads, 0);
  EXPECT_EQ(before.read_per_step, after.read_per_step - 4 * 325 + 4 * 325);
  EXPECT_EQ(before.written_per_step, after.written_per_step + 4 * 325);
  EXPECT_EQ(before.file_bytes, after.file_bytes + 2 * (int64_t{1} << 20));  // a 1 MiB block per unit's gradient
  EXPECT_EQ(before.step_buffers, 16 * 250);      // read_ahead = 1 unit, the largest
  EXPECT_EQ(before.gradient_buffers, 4 * 325);   // the two largest gradients: both here
  fsdp::StepPeak peak;
  peak.state = after.resident;
  peak.gathered = 2000;
  peak.activations = 100000;
  const int64_t forward = before.resident.total() + 2000 + 100000 + before.step_buffers;
  const int64_t backward = [&](int64_t transient) {
    return 2000 + 100000 + transient + before.resident.total() + before.gather_buffers + before.gradient_buffers;
  }(0);
  ASSERT_GT(forward, backward);
  EXPECT_EQ(fsdp::peak_with_nvme_offload(peak, before), forward);
  peak.backward_transient = 5000;  // now backward's is the larger
  EXPECT_EQ(fsdp::peak_with_nvme_offload(peak, before), backward + 5000);
  EXPECT_THROW(fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true, 1,
                                           int64_t{1} << 20, true, 1, true),
               c10::Error);
  EXPECT_THROW(fsdp::estimate_nvme_offload(kUnits, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, true, 1,
                                           int64_t{1} << 20, false, 1, true, /*gradient_slots=*/false),
               c10::Error);  // nowhere to write the gradients
}

// plan_run puts the estimates together as a run has them: a Llama layer's
// activations beyond the GPT block's (9 M C elements a layer, one layer's
// when checkpointed) and a run-ahead gather's buffer (the largest unit but
// the root, padded), on top of estimate_step_peak's own figures.
TEST(Planner, RunPlanAddsTheModelsActivationsAndTheRunAhead) {
  fsdp::ModelDescription gpt;
  gpt.shape = fsdp::TransformerShape{64, 16, 2, 2, 8, 2};
  gpt.layer_units = gpt.shape.unit_numels();
  fsdp::ModelDescription llama = gpt;
  const int64_t M = 2 * 16, C = 8, fp32 = 4;
  llama.shape.extra_layer_activations = 9 * C;
  fsdp::RunSettings settings;
  settings.world = 2;
  const auto plain = fsdp::FullyShardOptions();
  const auto checkpointed = fsdp::FullyShardOptions().activation_checkpointing(true);

  const fsdp::RunPlan base = fsdp::plan_run({gpt, plain, settings});
  EXPECT_EQ(base.peak.total(), fsdp::estimate_step_peak(gpt.shape, ShardingStrategy::kFullShard, 2, 2,
                                                        fsdp::MixedPrecision(), true, false, gpt.layer_units)
                                   .total());
  EXPECT_EQ(base.step_peak, base.peak.total());
  EXPECT_EQ(base.shard_group, 2);
  EXPECT_EQ(fsdp::plan_run({llama, plain, settings}).peak.activations - base.peak.activations, 2 * 9 * M * C * fp32);
  EXPECT_EQ(fsdp::plan_run({llama, checkpointed, settings}).peak.activations -
                fsdp::plan_run({gpt, checkpointed, settings}).peak.activations,
            9 * M * C * fp32);
  settings.gathers_run_ahead = true;
  const int64_t padded_block = (gpt.layer_units[1] + 1) / 2 * 2;
  EXPECT_EQ(fsdp::plan_run({gpt, plain, settings}).peak.gathered - base.peak.gathered, padded_block * fp32);
  fsdp::RunSettings sublayer = settings;
  sublayer.sublayer_units = true;
  EXPECT_THROW(fsdp::plan_run({gpt, plain, sublayer}), c10::Error);  // no sublayer units described
}

// The step-time model: with collectives measured for the plan's world and
// hosts, each kind's bytes over its rate, less the measured overlap; for
// another world, ring collectives over the links, hidden behind compute but
// the first unit's gather.
TEST(Planner, StepTimeFromMeasuredCollectivesOrRings) {
  fsdp::ModelDescription gpt;
  gpt.shape = fsdp::TransformerShape{64, 16, 2, 2, 8, 2};
  gpt.layer_units = gpt.shape.unit_numels();
  fsdp::RunSettings settings;
  settings.world = kWorld;
  settings.ranks_per_node = kHostRanks;
  const fsdp::RunPlan plan = fsdp::plan_run({gpt, fsdp::FullyShardOptions(), settings});
  fsdp::ClusterDescription cluster;
  cluster.flops = 1e12;
  cluster.intra_bandwidth = cluster.inter_bandwidth = 1e6;
  fsdp::ClusterDescription::MeasuredCollectives rates;
  rates.world = kWorld;
  rates.ranks_per_node = kHostRanks;
  rates.all_gather_world = rates.all_gather_world_int8 = rates.reduce_scatter_world = rates.all_gather_host =
      rates.reduce_scatter_host = rates.all_reduce_cross_host = rates.all_to_all_cross_host = 1e6;
  rates.overlap = 0.5;
  cluster.collectives = rates;
  // full_shard over 2 hosts: every byte crosses hosts, at 1e6 B/s.
  const double comm = static_cast<double>(plan.comm.total()) / 1e6, compute = comm * 2;
  const fsdp::StepTime measured = fsdp::estimate_step_time(plan, cluster, compute);
  EXPECT_DOUBLE_EQ(measured.comm, comm);
  EXPECT_DOUBLE_EQ(measured.step, compute + comm - 0.5 * comm);
  EXPECT_DOUBLE_EQ(measured.efficiency, compute / measured.step);
  settings.world = 2;  // not what was measured: the ring model, whose communication hides behind compute
  const fsdp::RunPlan two = fsdp::plan_run({gpt, fsdp::FullyShardOptions(), settings});
  const fsdp::StepTime ring = fsdp::estimate_step_time(two, cluster, 1e3);
  EXPECT_GT(ring.comm, 0);
  EXPECT_GT(ring.step, 1e3);  // the first unit's gather is not hidden
  EXPECT_LT(ring.step, 1e3 + ring.comm);
}

// Fine-tuning (docs/fine-tuning.md): a unit's frozen parameters are a flat
// buffer of their own, padded on its own, with a parameter shard and no
// gradient, no optimizer state and no reduction; gathered with their unit.
// A LoRA-like layout over K = 4 ranks: the root wholly frozen (1002
// elements, padded to 1004, shards of 251), a block with 40 adapter
// elements on 1000 frozen ones (shards 10 and 250), a block of 300 that
// trains whole (shard 75). Trainable shards 0 + 10 + 75 = 85 elements,
// padded 340; frozen shards 251 + 250 = 501, padded 2004.
namespace {
const std::vector<int64_t> kTrainable = {0, 40, 300}, kFrozen = {1002, 1000, 0};
}  // namespace

TEST(Planner, FrozenPartsHoldParameterBytesAlone) {
  const fsdp::MixedPrecision fp32, bf16 = fsdp::MixedPrecision().param_dtype(torch::kBFloat16);
  auto state = [](ShardingStrategy s, const fsdp::MixedPrecision& mp) {
    return fsdp::estimate_model_state(kTrainable, s, kWorld, kHostRanks, mp, 8, kFrozen);
  };
  // full_shard, fp32: 4 B a shard element, trainable or frozen.
  fsdp::ModelStateBytes b = state(ShardingStrategy::kFullShard, fp32);
  EXPECT_EQ(b.params, 4 * 85 + 4 * 501);
  EXPECT_EQ(b.frozen_params, 4 * 501);
  EXPECT_EQ(b.grads, 4 * 85);
  EXPECT_EQ(b.optimizer, 8 * 85);
  // Gathered: the root with its frozen part (4 x 1004) and the largest other
  // unit with its frozen part (4 x (40 + 1000)), not the one of 300.
  EXPECT_EQ(b.gathered_peak, 4 * 1004 + 4 * 1040);
  // no_shard, fp32: whole copies, of the frozen parameters too, but no gradient for them.
  b = state(ShardingStrategy::kNoShard, fp32);
  EXPECT_EQ(b.params, 4 * 340 + 4 * 2002);
  EXPECT_EQ(b.frozen_params, 4 * 2002);
  EXPECT_EQ(b.grads, 4 * 340);
  EXPECT_EQ(b.optimizer, 8 * 340);
  EXPECT_EQ(b.gathered_peak, 0);
  // zero1, bf16: a bf16 copy of each padded buffer and its fp32 master shard.
  b = state(ShardingStrategy::kZero1, bf16);
  EXPECT_EQ(b.frozen_params, (2 * 1004 + 4 * 251) + (2 * 1000 + 4 * 250));
  EXPECT_EQ(b.params, (2 * 40 + 4 * 10) + (2 * 300 + 4 * 75) + b.frozen_params);
  EXPECT_EQ(b.grads, 4 * 340);
  EXPECT_EQ(b.optimizer, 8 * 85);
  // A base held in bf16 (MixedPrecision::frozen_param_dtype, fp32 adapters):
  // 2 B a frozen shard element, gathered in bf16 beside the fp32 trainable part.
  const fsdp::MixedPrecision bf16_base = fsdp::MixedPrecision().frozen_param_dtype(torch::kBFloat16);
  b = state(ShardingStrategy::kFullShard, bf16_base);
  EXPECT_EQ(b.frozen_params, 2 * 501);
  EXPECT_EQ(b.params, 4 * 85 + 2 * 501);
  EXPECT_EQ(b.gathered_peak, 2 * 1004 + (4 * 40 + 2 * 1000));
  // no_shard: the bf16 buffer and its bf16 shard (no fp32 master for what never steps).
  b = state(ShardingStrategy::kNoShard, bf16_base);
  EXPECT_EQ(b.frozen_params, (2 * 1002 + 2 * 1002) + (2 * 1000 + 2 * 1000));
  expect_bytes(fsdp::estimate_comm_per_step(kTrainable, ShardingStrategy::kFullShard, kWorld, 0, bf16_base,
                                            ZeroPlusPlus(), kFrozen),
               {2 * (4 * 340 + 2 * 2004), 4 * 340, 0, 0, 0});
  // Nothing frozen, as a list of zeros or as none: today's figures.
  for (ShardingStrategy s : {ShardingStrategy::kNoShard, ShardingStrategy::kZero1, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kFullShard, ShardingStrategy::kHybridShard}) {
    const auto none = fsdp::estimate_model_state(kUnits, s, kWorld, kHostRanks, bf16);
    const auto zeros = fsdp::estimate_model_state(kUnits, s, kWorld, kHostRanks, bf16, 8, {0, 0});
    EXPECT_EQ(none.params, zeros.params);
    EXPECT_EQ(none.gathered_peak, zeros.gathered_peak);
    EXPECT_EQ(zeros.frozen_params, 0);
    expect_bytes(fsdp::estimate_comm_per_step(kUnits, s, kWorld, kHostRanks, bf16, ZeroPlusPlus(), {0, 0}),
                 [&] {
                   const auto c = fsdp::estimate_comm_per_step(kUnits, s, kWorld, kHostRanks, bf16);
                   return Expected{c.all_gather, c.reduce_scatter, c.all_reduce, c.all_to_all, c.cross_host};
                 }());
  }
  EXPECT_THROW(fsdp::estimate_model_state(kTrainable, ShardingStrategy::kFullShard, kWorld, kHostRanks, fp32, 8, {1}),
               c10::Error);
}

// QLoRA (MixedPrecision::frozen_nf4): of a unit's frozen elements, its NF4
// weights (in whole blocks of 64) are a buffer of whole 36-byte records a
// rank, gathered as records and dequantized beside them. The layout above
// with the block's 1000 frozen elements as 640 of NF4 weights (10 blocks:
// padded to 12 over K = 4, 3 records a rank) and 360 others (shards of 90).
TEST(Planner, Nf4WeightsAreHeldAndGatheredAsRecords) {
  const std::vector<int64_t> nf4 = {0, 640, 0};
  const fsdp::MixedPrecision qlora = fsdp::MixedPrecision().frozen_param_dtype(torch::kBFloat16).frozen_nf4(true);
  fsdp::ModelStateBytes b =
      fsdp::estimate_model_state(kTrainable, ShardingStrategy::kFullShard, kWorld, kHostRanks, qlora, 8, kFrozen, nf4);
  EXPECT_EQ(b.frozen_params, 2 * 251 + 2 * 90 + 3 * 36);
  EXPECT_EQ(b.params, 4 * 85 + b.frozen_params);
  // Gathered: the root (bf16, 1004), the block: its adapters (fp32, 40), its
  // other frozen elements (bf16, 360), its 12 blocks dequantized (bf16, 768)
  // beside their 12 records.
  EXPECT_EQ(b.gathered_peak, 2 * 1004 + (4 * 40 + 2 * 360 + 2 * 768 + 12 * 36));
  // Twice a step for full_shard: the records, not bf16's 2 bytes an element.
  expect_bytes(fsdp::estimate_comm_per_step(kTrainable, ShardingStrategy::kFullShard, kWorld, 0, qlora, ZeroPlusPlus(),
                                            kFrozen, nf4),
               {2 * (4 * 340 + 2 * (1004 + 360) + 12 * 36), 4 * 340, 0, 0, 0});
  // Without frozen_nf4 the counts are ignored: a bf16 base.
  const fsdp::MixedPrecision bf16_base = fsdp::MixedPrecision().frozen_param_dtype(torch::kBFloat16);
  EXPECT_EQ(fsdp::estimate_model_state(kTrainable, ShardingStrategy::kFullShard, kWorld, kHostRanks, bf16_base, 8,
                                       kFrozen, nf4).frozen_params,
            2 * 501);
}

// Frozen parts are gathered as their units are (twice a step for
// full_shard) and reduce nothing; replicated strategies move no bytes for them.
TEST(Planner, FrozenPartsAreGatheredAndNeverReduced) {
  auto comm = [](ShardingStrategy s, int ranks_per_node) {
    return fsdp::estimate_comm_per_step(kTrainable, s, kWorld, ranks_per_node, fsdp::MixedPrecision(), ZeroPlusPlus(),
                                        kFrozen);
  };
  // Gathered per pass: 0 + 40 + 300 trainable and 1004 + 1000 frozen elements, 4 B each.
  const int64_t gathered = 4 * (340 + 2004), reduced = 4 * 340;
  expect_bytes(comm(ShardingStrategy::kFullShard, 0), {2 * gathered, reduced, 0, 0, 0});
  expect_bytes(comm(ShardingStrategy::kFullShard, kHostRanks), {2 * gathered, reduced, 0, 0, 2 * gathered + reduced});
  expect_bytes(comm(ShardingStrategy::kShardGradOp, 0), {gathered, reduced, 0, 0, 0});
  // hybrid_shard over hosts of 2: the frozen parts pad to 1002 and 1000; the
  // shard's all-reduce across hosts is the trainable shards' alone (0 + 20 + 150).
  expect_bytes(comm(ShardingStrategy::kHybridShard, kHostRanks),
               {2 * 4 * (340 + 2002), reduced, 4 * 170, 0, 4 * 170});
  expect_bytes(comm(ShardingStrategy::kNoShard, 0), {0, 0, reduced, 0, 0});
  expect_bytes(comm(ShardingStrategy::kZero1, 0), {reduced, 0, reduced, 0, 0});
}

// The step's peak: the unit gathered ahead is the largest with its frozen
// part, backward's gradient buffers are the largest trainable part's
// (here the block of 300), as for a model of the trainable parts alone;
// checkpoint staging saves the frozen shards without optimizer state.
TEST(Planner, FrozenPartsInTheStepPeakAndCheckpointStaging) {
  const fsdp::TransformerShape shape{64, 16, 2, 2, 8, 2};
  const fsdp::MixedPrecision fp32;
  const auto peak = fsdp::estimate_step_peak(shape, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, false,
                                             kTrainable, ZeroPlusPlus(), kFrozen);
  const auto trainable_only = fsdp::estimate_step_peak(shape, ShardingStrategy::kFullShard, kWorld, 0, fp32, true,
                                                       false, kTrainable);
  EXPECT_EQ(peak.gathered, 4 * 1004 + 4 * 1040 + 4 * 1040);  // the root, the largest other, one more ahead
  EXPECT_EQ(peak.activations, trainable_only.activations);
  EXPECT_EQ(peak.backward_transient, trainable_only.backward_transient);
  EXPECT_EQ(peak.state.total(), trainable_only.state.total() + 4 * 501);
  const auto sharded = fsdp::estimate_checkpoint_staging(kTrainable, ShardingStrategy::kFullShard, kWorld, 0, false, 8,
                                                         kFrozen);
  EXPECT_EQ(sharded.rank0, 12 * 85 + 4 * 501);
  EXPECT_EQ(sharded.per_rank, sharded.rank0);
  const auto full = fsdp::estimate_checkpoint_staging(kTrainable, ShardingStrategy::kFullShard, kWorld, 0, true, 8,
                                                      kFrozen);
  EXPECT_EQ(full.rank0, 12 * 340 + 4 * 2004);
  fsdp::ModelDescription model;
  model.shape = shape;
  model.layer_units = kTrainable;
  model.layer_frozen = kFrozen;
  fsdp::RunSettings settings;
  settings.world = kWorld;
  EXPECT_EQ(fsdp::plan_run({model, fsdp::FullyShardOptions(), settings}).peak.state.frozen_params, 4 * 501);
}

// On disk a frozen part has its parameters' slot alone (shards of 251 and
// 250 elements, a block each), is read by both gathers of a step and never
// written; with the parameters in memory it stays there.
TEST(Planner, FrozenPartsOnDiskAreReadAndNeverWritten) {
  const fsdp::MixedPrecision fp32;
  constexpr int64_t kBlock = int64_t{1} << 20;
  auto plan = [&](bool params, const std::vector<int64_t>& frozen) {
    return fsdp::estimate_nvme_offload(kTrainable, ShardingStrategy::kFullShard, kWorld, 0, fp32, true, params, 1,
                                       kBlock, false, 2, false, true, frozen);
  };
  const auto with_frozen = plan(true, kFrozen), without = plan(true, {});
  EXPECT_EQ(with_frozen.file_bytes - without.file_bytes, 2 * kBlock);
  EXPECT_EQ(with_frozen.offloaded - without.offloaded, 4 * 251 + 4 * 250);
  EXPECT_EQ(with_frozen.read_per_step - without.read_per_step, 2 * (4 * 251 + 4 * 250));
  EXPECT_EQ(with_frozen.written_per_step, without.written_per_step);
  EXPECT_EQ(with_frozen.resident.frozen_params, 0);
  EXPECT_EQ(with_frozen.step_buffers, without.step_buffers);  // nothing of theirs steps
  const auto optimizer_only = plan(false, kFrozen);
  EXPECT_EQ(optimizer_only.file_bytes, plan(false, {}).file_bytes);
  EXPECT_EQ(optimizer_only.resident.frozen_params, 4 * 501);
}

// describe_units splits a real model as fully_shard does: LoRA on the tiny
// GPT's c_attn and c_proj freezes every base parameter (the config's units,
// now frozen parts) and trains 4 (in + out) elements per adapted linear in
// the block or sublayer unit that holds it; a model that freezes nothing
// is described as its config describes it.
TEST(Planner, DescribeUnitsSplitsTrainableAndFrozenAsFullyShardDoes) {
  const fsdp::models::ModelConfig config = fsdp::testing::tiny();
  const fsdp::ModelDescription plain = config.plan_description();
  fsdp::models::GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
  fsdp::ModelDescription described = plain;
  for (bool sublayer : {false, true}) described.describe_units(sublayer, *model, config.wrap_policy(sublayer));
  EXPECT_EQ(described.layer_units, plain.layer_units);
  EXPECT_EQ(described.sublayer_units, plain.sublayer_units);
  EXPECT_TRUE(described.layer_frozen.empty() && described.sublayer_frozen.empty());

  fsdp::lora::apply(*model, fsdp::lora::LoraOptions().rank(4).targets({"c_attn", "c_proj"}));
  for (bool sublayer : {false, true}) described.describe_units(sublayer, *model, config.wrap_policy(sublayer));
  const int64_t C = 64, attention = 4 * ((C + 3 * C) + (C + C)), mlp = 4 * (4 * C + C);
  EXPECT_EQ(described.layer_units, (std::vector<int64_t>{0, attention + mlp, attention + mlp}));
  EXPECT_EQ(described.layer_frozen, plain.layer_units);
  EXPECT_EQ(described.sublayer_units, (std::vector<int64_t>{0, attention, mlp, attention, mlp}));
  EXPECT_EQ(described.sublayer_frozen, plain.sublayer_units);
  EXPECT_EQ(described.num_trainable(), 2 * (attention + mlp));
  EXPECT_EQ(described.num_parameters(), plain.num_parameters() + 2 * (attention + mlp));
}

// The tools' warning for bf16 on a CPU without bf16 instructions, from
// /proc/cpuinfo's text: an AVX2-only AMD (the measured 30x), Zen 4 (AVX-512
// BF16), Sapphire Rapids (AMX), an Arm with and without BF16, and a text
// that says nothing.
TEST(Planner, WarnsOfBf16OnACpuWithoutBf16Instructions) {
  const std::string avx2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx fma avx2\n\n"
                           "processor\t: 1\nflags\t\t: fpu avx512_bf16\n";
  const std::string warning = fsdp::cpu_bf16_warning(avx2);
  EXPECT_NE(warning.find("bf16 compute on this CPU (AMD EPYC 7B12; it has avx2, but neither AVX-512 BF16 nor AMX) "
                         "runs in emulation: about 30x slower than fp32"),
            std::string::npos)
      << warning;
  EXPECT_EQ(fsdp::cpu_bf16_warning("model name\t: AMD EPYC 9R14\nflags\t\t: avx2 avx512f avx512_bf16\n"), "");
  EXPECT_EQ(fsdp::cpu_bf16_warning("model name\t: Intel Xeon 8488C\nflags\t\t: avx2 avx512f amx_bf16 amx_tile\n"), "");
  EXPECT_EQ(fsdp::cpu_bf16_warning("processor\t: 0\nFeatures\t: fp asimd sve bf16\n"), "");
  EXPECT_NE(fsdp::cpu_bf16_warning("processor\t: 0\nFeatures\t: fp asimd\n").find("it has asimd, but neither"),
            std::string::npos);
  EXPECT_EQ(fsdp::cpu_bf16_warning("processor\t: 0\n"), "");
}
