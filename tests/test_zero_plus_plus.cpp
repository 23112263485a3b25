// ZeRO++'s options (FullyShardOptions::zero_plus_plus) at W = 2, 3 and 4,
// the hosts made of ranks_per_node ranks (W / 2 at even W: two hosts; one
// rank per host at W = 3): the bytes each option moves, inside and across
// hosts, to the byte against the planner; the secondary partition's memory;
// determinism; what each option does to the numbers; the refusals.
//
// What holds against plain full_shard:
//   secondary_partition alone: the same losses bit for bit (backward gathers
//     the host's copies of exactly what forward gathered);
//   the quantized ones: not bit-equal (the gathered weights, or the reduced
//     gradients, carry int8 rounding), but deterministic (the same run twice
//     gives the same losses bit for bit) and within 2 % of full_shard's
//     losses over the steps here.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "plan/estimates.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"

namespace {

using fsdp::FullyShardOptions;
using fsdp::Quantization;
using fsdp::ShardingStrategy;
using fsdp::ZeroPlusPlus;
using fsdp::testing::world_group;

// Two hosts at even W, else one rank per host (W hosts).
int host_ranks() { return world_group->size() % 2 == 0 ? world_group->size() / 2 : 1; }

FullyShardOptions zpp_options(ShardingStrategy strategy, ZeroPlusPlus z, torch::ScalarType dtype = torch::kFloat) {
  return fsdp::testing::options_for(strategy, dtype, host_ranks()).zero_plus_plus(z);
}

ZeroPlusPlus qwz() { return ZeroPlusPlus().gather_quantization(Quantization::kInt8); }
ZeroPlusPlus hpz() { return ZeroPlusPlus().secondary_partition(true); }
ZeroPlusPlus qgz() { return ZeroPlusPlus().gradient_quantization(Quantization::kInt8); }
ZeroPlusPlus all_three() { return qwz().secondary_partition(true).gradient_quantization(Quantization::kInt8); }

std::string describe(const ZeroPlusPlus& z) {
  std::string s = std::string("gather ") + fsdp::enum_name(z.gather_quantization()) + ", secondary " +
                  (z.secondary_partition() ? "on" : "off") + ", gradients " +
                  fsdp::enum_name(z.gradient_quantization());
  return s;
}

std::vector<double> losses(ShardingStrategy strategy, ZeroPlusPlus z, int64_t steps = 4) {
  return fsdp::testing::train_losses(zpp_options(strategy, z), steps, torch::kCPU);
}

}  // namespace

// The counters of a steady-state step (the third), per kind and across
// hosts, equal the planner's figures exactly, for every option alone and
// all together, at fp32 and bf16, for full_shard and shard_grad_op.
TEST(ZeroPlusPlus, BytesPerStepMatchThePlannerInsideAndAcrossHosts) {
  const int W = world_group->size(), r = world_group->rank();
  auto data = fsdp::testing::data_for(fsdp::testing::tiny());
  struct Case {
    ShardingStrategy strategy;
    ZeroPlusPlus z;
    torch::ScalarType dtype;
  };
  const std::vector<Case> cases = {
      {ShardingStrategy::kFullShard, ZeroPlusPlus(), torch::kFloat},
      {ShardingStrategy::kFullShard, qwz(), torch::kFloat},
      {ShardingStrategy::kFullShard, hpz(), torch::kFloat},
      {ShardingStrategy::kFullShard, qgz(), torch::kFloat},
      {ShardingStrategy::kFullShard, all_three(), torch::kFloat},
      {ShardingStrategy::kFullShard, all_three(), torch::kBFloat16},
      {ShardingStrategy::kFullShard, all_three().quantization_block(256), torch::kFloat},
      {ShardingStrategy::kShardGradOp, qwz().gradient_quantization(Quantization::kInt8), torch::kFloat},
      {ShardingStrategy::kHybridShard, qwz(), torch::kFloat},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(fsdp::enum_name(c.strategy)) + ", " + describe(c.z) +
                 (c.dtype == torch::kFloat ? "" : ", bf16") + ", block " + std::to_string(c.z.quantization_block()));
    auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(fsdp::testing::tiny()), world_group,
                                     zpp_options(c.strategy, c.z, c.dtype));
    fsdp::FusedAdamW optimizer(sharded.parameters(), fsdp::testing::spec_adamw());
    fsdp::CommStats stats, across;
    for (int step = 0; step < 3; ++step) {
      sharded.state().reset_comm_stats();
      auto [x, y] = data.batch(step, 0, r, W, 1, 2);
      sharded.forward(x, y).backward();
      optimizer.step();
      optimizer.zero_grad();
      stats = sharded.state().comm_stats();
      across = sharded.state().cross_host_comm_stats();
    }
    const fsdp::CommBytes planned =
        fsdp::estimate_comm_per_step(fsdp::testing::gpt_unit_numels(fsdp::testing::tiny()), c.strategy, W,
                                     host_ranks(), fsdp::MixedPrecision().param_dtype(c.dtype), c.z);
    auto kind = [&stats](fsdp::CollectiveKind k) { return stats.bytes[static_cast<int>(k)]; };
    EXPECT_EQ(kind(fsdp::CollectiveKind::kAllGather), planned.all_gather);
    EXPECT_EQ(kind(fsdp::CollectiveKind::kReduceScatter), planned.reduce_scatter);
    EXPECT_EQ(kind(fsdp::CollectiveKind::kAllReduce), planned.all_reduce);
    EXPECT_EQ(kind(fsdp::CollectiveKind::kAllToAll), planned.all_to_all);
    EXPECT_EQ(across.total_bytes(), planned.cross_host);
    EXPECT_EQ(stats.total_bytes() - across.total_bytes(), planned.inside_host());
    // Plain full_shard over several hosts crosses them with everything.
    if (c.strategy == ShardingStrategy::kFullShard && !c.z.any() && W / host_ranks() > 1) {
      EXPECT_EQ(across.total_bytes(), stats.total_bytes());
    }
  }
}

// The quantized all-gather moves about a quarter of fp32's bytes (int8 and
// one fp32 scale per block), and the quantized reduction's cross-host part
// about 1 / (4 * ranks per host) of the plain reduce-scatter's.
TEST(ZeroPlusPlus, AllThreeCutTheBytesAcrossHostsToUnderAFifth) {
  const int W = world_group->size();
  if (W / host_ranks() < 2) GTEST_SKIP() << "one host";
  const auto units = fsdp::testing::gpt_unit_numels(fsdp::testing::tiny());
  const int64_t plain = fsdp::estimate_comm_per_step(units, ShardingStrategy::kFullShard, W, host_ranks(),
                                                     fsdp::MixedPrecision()).cross_host;
  const int64_t zpp = fsdp::estimate_comm_per_step(units, ShardingStrategy::kFullShard, W, host_ranks(),
                                                   fsdp::MixedPrecision(), all_three()).cross_host;
  EXPECT_LT(static_cast<double>(zpp), 0.2 * static_cast<double>(plain)) << zpp << " of " << plain;
}

// hpZ alone changes where backward gathers from, not what it gathers.
TEST(ZeroPlusPlus, SecondaryPartitionAloneTrainsBitForBitAsFullShard) {
  EXPECT_EQ(losses(ShardingStrategy::kFullShard, hpz()), losses(ShardingStrategy::kFullShard, ZeroPlusPlus()));
}

// Quantization rounds half to even and sums in a fixed order: the same run
// twice gives the same losses, bit for bit.
TEST(ZeroPlusPlus, QuantizedRunsAreDeterministic) {
  for (const ZeroPlusPlus& z : {qwz(), qgz(), all_three()}) {
    SCOPED_TRACE(describe(z));
    EXPECT_EQ(losses(ShardingStrategy::kFullShard, z), losses(ShardingStrategy::kFullShard, z));
  }
}

// Not bit-equal to full_shard, but the same training: within 2 % of its
// losses at every step (measured: at most 0.1 %; a lost or unaveraged
// gradient, or a wrong slice, moves them by far more within these steps),
// and really quantized (not equal).
TEST(ZeroPlusPlus, QuantizedRunsStayCloseToFullShard) {
  const std::vector<double> plain = losses(ShardingStrategy::kFullShard, ZeroPlusPlus(), 6);
  for (const ZeroPlusPlus& z : {qwz(), qgz(), all_three()}) {
    SCOPED_TRACE(describe(z));
    const std::vector<double> quantized = losses(ShardingStrategy::kFullShard, z, 6);
    ASSERT_EQ(quantized.size(), plain.size());
    EXPECT_NE(quantized, plain);
    for (size_t s = 0; s < plain.size(); ++s) EXPECT_NEAR(quantized[s], plain[s], 0.02 * plain[s]) << "step " << s;
  }
}

// From the end of forward to backward each unit holds 1/K of itself (K
// ranks per host) in the param dtype, as the planner counts it; nothing is
// left after backward.
TEST(ZeroPlusPlus, SecondaryPartitionHoldsTheHostsSliceFromForwardToBackward) {
  const int W = world_group->size(), r = world_group->rank();
  auto data = fsdp::testing::data_for(fsdp::testing::tiny());
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(fsdp::testing::tiny()), world_group,
                                     zpp_options(ShardingStrategy::kFullShard, hpz(), dtype));
    using fsdp::memory::Category;
    const int64_t before = fsdp::memory::usage().live(Category::kSecondaryPartition);
    auto [x, y] = data.batch(0, 0, r, W, 1, 2);
    torch::Tensor loss = sharded.forward(x, y);
    int64_t expected = 0;
    for (const auto& unit : fsdp::detail::units(sharded.state())) {
      expected += unit->flat_param().padded_numel() / host_ranks() * c10::elementSize(dtype);
    }
    EXPECT_EQ(fsdp::memory::usage().live(Category::kSecondaryPartition) - before, expected);
    loss.backward();
    EXPECT_EQ(fsdp::memory::usage().live(Category::kSecondaryPartition), before);
    // Evaluation keeps none: no backward will use it.
    {
      torch::NoGradGuard no_grad;
      sharded.forward(x, y);
    }
    EXPECT_EQ(fsdp::memory::usage().live(Category::kSecondaryPartition), before);
  }
}

// After each step of training the small preset, a quantized gather gives
// every rank the same parameters, each within its block's bound (max |x| /
// 254 over the block of the owning rank's shard) of the fp32 master.
TEST(ZeroPlusPlus, QuantizedGatherGivesEveryRankTheMastersWithinTheBlockBound) {
  const int W = world_group->size(), r = world_group->rank();
  const fsdp::models::GPTConfig config = fsdp::models::GPTConfig::preset("small");
  fsdp::models::TokenData data(fsdp::testing::make_token_file("zpp-small", 40000, config.vocab), config.context,
                               config.vocab);
  auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(config), world_group,
                                   zpp_options(ShardingStrategy::kFullShard, qwz()));
  fsdp::FusedAdamW optimizer(sharded.parameters(), fsdp::testing::spec_adamw());
  const int64_t block = qwz().quantization_block();
  for (int step = 0; step < 8; ++step) {
    auto [x, y] = data.batch(step, 0, r, W, 1, 2);
    sharded.forward(x, y).backward();
    optimizer.step();
    optimizer.zero_grad();
    for (const auto& unit : fsdp::detail::units(sharded.state())) {
      fsdp::FlatParam& flat = unit->flat_param();
      const torch::Tensor exact = flat.gather_full(flat.shard().detach());
      flat.unshard();
      torch::Tensor gathered = torch::cat([&] {
        std::vector<torch::Tensor> parts;
        for (const auto& e : flat.entries()) parts.push_back(e.param.detach().reshape({-1}));
        return parts;
      }());
      flat.reshard();
      const int64_t S = flat.shard_numel(), nb = (S + block - 1) / block;
      torch::Tensor by_block = torch::constant_pad_nd(exact.view({W, S}), {0, nb * block - S}).view({W, nb, block});
      torch::Tensor bound = by_block.abs().amax(2, true).div(254.0).expand({W, nb, block}).reshape({W, -1});
      bound = bound.narrow(1, 0, S).reshape({-1}).narrow(0, 0, flat.numel());
      torch::Tensor error = (gathered - exact.narrow(0, 0, flat.numel())).abs();
      // Slack as in Quantize.OneRoundTripIsWithinHalfAStepOfEachBlocksRange.
      EXPECT_TRUE((error <= bound * (1 + 1e-4)).all().item<bool>())
          << "step " << step << ", unit " << unit->display_name() << ": worst excess "
          << (error - bound).max().item<double>();
      torch::Tensor sums = torch::empty({W}, torch::kDouble);
      world_group->all_gather(sums, gathered.to(torch::kDouble).sum().reshape({1}))->wait();
      EXPECT_TRUE(torch::equal(sums, sums[0].expand({W}))) << "ranks gathered different parameters: " << sums;
    }
  }
}

// An UnshardScope's gathers are exact: the full parameters are the masters
// themselves, not their int8 rounding.
TEST(ZeroPlusPlus, UnshardScopeGathersExactly) {
  auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(fsdp::testing::tiny()), world_group,
                                   zpp_options(ShardingStrategy::kFullShard, qwz()));
  auto reference = fsdp::testing::make_gpt(fsdp::testing::tiny());
  fsdp::UnshardScope scope(sharded.state());
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(torch::equal(sharded->named_parameters()[item.key()], item.value())) << item.key();
  }
}

// Each refusal says what was asked for and why it cannot help, before any
// parameter is touched.
TEST(ZeroPlusPlus, RefusesOptionsThatCannotHelp) {
  struct Case {
    ShardingStrategy strategy;
    ZeroPlusPlus z;
    std::string says;
  };
  const std::vector<Case> cases = {
      {ShardingStrategy::kNoShard, qwz(), "need a sharded strategy"},
      {ShardingStrategy::kZero1, qgz(), "need a sharded strategy"},
      {ShardingStrategy::kShardGradOp, hpz(), "secondary_partition (hpZ) needs full_shard, found shard_grad_op"},
      {ShardingStrategy::kHybridShard, hpz(), "already gathers inside the host"},
      {ShardingStrategy::kHybridShard, qgz(), "gradient_quantization (qgZ) needs full_shard or shard_grad_op"},
      {ShardingStrategy::kFullShard, qwz().quantization_block(6), "positive multiple of 4 elements"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(fsdp::enum_name(c.strategy)) + ", " + describe(c.z));
    auto model = fsdp::testing::make_gpt(fsdp::testing::tiny());
    const torch::Tensor before = model->transformer->wte->weight.detach().clone();
    try {
      fsdp::fully_shard(model, world_group, zpp_options(c.strategy, c.z));
      ADD_FAILURE() << "not refused";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(model->transformer->wte->weight, before));  // untouched
  }
}
