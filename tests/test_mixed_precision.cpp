// Mixed precision at W = 2, 3 and 4: bf16 parameters with an fp16
// gradient reduction under dynamic loss scaling, overflowing steps skipped
// on every rank alike. (bf16 parameters in every strategy's communication
// and memory: test_sharding.cpp, test_memory.cpp; bf16 collectives:
// test_collectives.cpp.)

#include <gtest/gtest.h>

#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/grad_utils.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"

using fsdp::ShardingStrategy;
using fsdp::testing::world_group;
using fsdp::testing::data_for;
using fsdp::testing::options_for;
using fsdp::testing::tiny;

// fp16 gradient reduction with dynamic loss scaling, started at a scale
// that overflows fp16: the first steps are skipped on every rank alike, the
// scale backs off until steps go through, and training then proceeds
// without NaN or divergence.
TEST(MixedPrecision, Fp16LossScalingSkipsOverflowingStepsOnEveryRankAlike) {
  const int W = world_group->size(), r = world_group->rank();
  auto data = data_for(tiny());
  auto options = options_for(ShardingStrategy::kFullShard)
                     .mixed_precision(fsdp::MixedPrecision().param_dtype(torch::kBFloat16).reduce_dtype(torch::kHalf));
  auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(tiny()), world_group, options);
  torch::optim::AdamW optimizer(sharded.parameters(), fsdp::testing::spec_adamw());
  fsdp::GradScaler scaler(sharded.state(), fsdp::GradScalerOptions().init_scale(std::pow(2.0, 24)).growth_interval(10));
  int skipped = 0, stepped = 0;
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < 40; ++step) {
    auto [x, y] = data.batch(step, 0, r, W, 1, 2);
    torch::Tensor loss = sharded.forward(x, y);
    scaler.scale(loss).backward();
    const bool took_step = scaler.step(optimizer);
    optimizer.zero_grad();
    (took_step ? stepped : skipped)++;
    torch::Tensor decisions = torch::empty({W}, torch::kInt);
    world_group->all_gather(decisions, torch::tensor({took_step ? 1 : 0}, torch::kInt))->wait();
    EXPECT_EQ(decisions.min().item<int>(), decisions.max().item<int>()) << "ranks disagree on step " << step;
    world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();
    ASSERT_TRUE(std::isfinite(loss.item<double>())) << "step " << step;
    if (step == 0) first_loss = loss.item<double>();
    last_loss = loss.item<double>();
  }
  EXPECT_GE(skipped, 2) << "a scale of 2^24 must overflow fp16 at first";
  EXPECT_GE(stepped, 25);
  EXPECT_LT(scaler.scale_factor(), std::pow(2.0, 24));
  EXPECT_LT(last_loss, first_loss - 0.3) << "training with loss scaling did not progress";
}
