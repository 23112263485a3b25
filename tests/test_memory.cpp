// Memory per rank at W = 2, 3 and 4, measured by the counting allocator:
// each rank holds exactly its share; the model state of every strategy
// matches the ZeRO formulas and the planner's estimate to the byte; the
// block cache is sized to the largest unit and reused across steps. The
// allocator itself is tested in test_allocator.cpp.

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "core/fsdp_state_impl.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "plan/estimates.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::ShardingStrategy;
using fsdp::memory::Category;
using fsdp::testing::world_group;
using fsdp::testing::block_units;
using fsdp::testing::data_for;
using fsdp::testing::gpt_unit_numels;
using fsdp::testing::kAllStrategies;
using fsdp::testing::make_gpt;
using fsdp::testing::name_of;
using fsdp::testing::options_for;
using fsdp::testing::padded_sum;
using fsdp::testing::ranks_per_node;
using fsdp::testing::shard_size;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::uneven;

TEST(Memory, EachRankHoldsExactlyItsShareMeasuredByTheAllocator) {
  const int W = world_group->size();
  GPTConfig config = tiny();
  GPT model = make_gpt(config);
  const int64_t num_parameters = model->num_parameters();
  const auto before = fsdp::memory::usage();
  auto sharded = fsdp::fully_shard(model, world_group, block_units());
  const auto after_shard = fsdp::memory::usage();

  // Expected: ceil(N_u / W) fp32 elements per unit, computed from the spec's
  // shapes (root = wte + wpe + ln_f; block = 12 C^2 + 13 C), not from our code.
  const int64_t C = config.width;
  std::vector<int64_t> unit_numel = {config.vocab * C + config.context * C + 2 * C};
  for (int64_t i = 0; i < config.layers; ++i) unit_numel.push_back(12 * C * C + 13 * C);
  int64_t expected_shard_bytes = 0, total_numel = 0;
  for (int64_t n : unit_numel) {
    expected_shard_bytes += (n + W - 1) / W * 4;
    total_numel += n;
  }
  ASSERT_EQ(static_cast<int64_t>(fsdp::detail::units(sharded.state()).size()), config.layers + 1);
  EXPECT_EQ(total_numel, num_parameters);
  EXPECT_EQ(after_shard.live(Category::kParameterShard) - before.live(Category::kParameterShard), expected_shard_bytes);
  EXPECT_EQ(after_shard.live(Category::kUnshardedBuffer), before.live(Category::kUnshardedBuffer));

  // After a step: gradient shards of the same size, Adam's two moments twice
  // that, and nothing unsharded.
  torch::optim::AdamW optimizer(sharded.parameters(), spec_adamw());
  fsdp::models::TokenData data(fsdp::testing::make_token_file("share", 5000, config.vocab), config.context,
                               config.vocab);
  auto [x, y] = data.batch(0, 0, world_group->rank(), W, 1, 2);
  sharded.forward(x, y).backward();
  {
    fsdp::memory::MemoryCategoryScope scope(Category::kOptimizerState);
    optimizer.step();
  }
  const auto after_step = fsdp::memory::usage();
  EXPECT_EQ(after_step.live(Category::kGradientShard) - before.live(Category::kGradientShard), expected_shard_bytes);
  EXPECT_EQ(after_step.live(Category::kOptimizerState) - before.live(Category::kOptimizerState),
            2 * expected_shard_bytes);
  EXPECT_EQ(after_step.live(Category::kUnshardedBuffer), before.live(Category::kUnshardedBuffer));
  // The original parameters hold no data between steps.
  for (const auto& p : model->parameters()) EXPECT_EQ(p.numel(), 0);
  sharded.state().check_idle();
}

// Per-rank model state after a step, by category, measured by the
// allocator: equal to the README's ZeRO table, written out here for fp32
// and bf16 params, and to estimate_model_state (the planner's figures). On
// the tiny preset and on a model whose units pad at every W, so that the
// padded sizes (Np, S) differ from the unpadded (N, N/K) wherever they can.
TEST(Memory, ModelStateMatchesTheZeroFormulasToTheByte) {
  const int W = world_group->size(), r = world_group->rank();
  for (const GPTConfig& config : {tiny(), uneven()}) {
    auto data = data_for(config);
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (ShardingStrategy strategy : kAllStrategies) {
        SCOPED_TRACE(name_of(config) + " " + name_of(strategy) + (dtype == torch::kFloat ? "" : " bf16"));
        const auto before = fsdp::memory::usage();
        {
          auto sharded =
              fsdp::fully_shard(fsdp::testing::make_gpt(config), world_group, options_for(strategy, dtype));
          torch::optim::AdamW optimizer(sharded.parameters(), fsdp::testing::spec_adamw());
          auto [x, y] = data.batch(0, 0, r, W, 1, 2);
          sharded.forward(x, y).backward();
          {
            fsdp::memory::MemoryCategoryScope scope(Category::kOptimizerState);
            optimizer.step();
          }
          const auto after = fsdp::memory::usage();
          const int64_t params = after.live(Category::kParameterShard) - before.live(Category::kParameterShard);
          const int64_t grads = after.live(Category::kGradientShard) - before.live(Category::kGradientShard);
          const int64_t optim = after.live(Category::kOptimizerState) - before.live(Category::kOptimizerState);

          // The table: N elements, padded to Np for a shard group of K ranks,
          // S = Np/K per rank; 4 bytes per fp32 master element or gradient,
          // 8 for Adam's two moments, and 2 per element of the bf16 copy that
          // the strategies whose params stay unsharded keep.
          const int64_t K = shard_size(strategy), N = padded_sum(config, 1), Np = padded_sum(config, K), S = Np / K;
          if (K > 1 && config.width == uneven().width) ASSERT_GT(Np, N) << "the model must pad";
          const int64_t copy = dtype == torch::kFloat ? 0 : 2;  // bytes per element of a bf16 copy (none in fp32)
          switch (strategy) {
            case ShardingStrategy::kNoShard:
              EXPECT_EQ(params, 4 * N + copy * N);
              EXPECT_EQ(grads, 4 * N);
              EXPECT_EQ(optim, 8 * N);
              break;
            case ShardingStrategy::kZero1:  // in fp32 the master shard is a slice of the replicated params
              EXPECT_EQ(params, dtype == torch::kFloat ? 4 * Np : copy * Np + 4 * S);
              EXPECT_EQ(grads, 4 * Np);
              EXPECT_EQ(optim, 8 * S);
              break;
            default:  // sharded: gathered params, bf16 or not, are freed between steps
              EXPECT_EQ(params, 4 * S);
              EXPECT_EQ(grads, 4 * S);
              EXPECT_EQ(optim, 8 * S);
          }
          // The planner's figures are the same.
          auto estimate = fsdp::estimate_model_state(gpt_unit_numels(config), strategy, W, ranks_per_node(),
                                                     fsdp::MixedPrecision().param_dtype(dtype));
          EXPECT_EQ(params, estimate.params);
          EXPECT_EQ(grads, estimate.grads);
          EXPECT_EQ(optim, estimate.optimizer);
          // Nothing unsharded is left between steps but what the strategy keeps.
          EXPECT_EQ(after.live(Category::kUnshardedBuffer), before.live(Category::kUnshardedBuffer));
        }
        EXPECT_EQ(fsdp::memory::usage().model_state(), before.model_state()) << "model state outlived its model";
      }
    }
  }
}

// fully_shard sizes the host block cache to six of its largest unit's fp32
// buffers (the option off leaves it alone), and a later step's gathers come
// from the cache: it holds blocks between steps.
TEST(Memory, TheBlockCacheIsSizedToTheLargestUnitAndReusedAcrossSteps) {
  namespace mem = fsdp::memory;
  const int64_t saved_limit = mem::block_cache_limit();
  mem::set_block_cache_limit(0);
  GPTConfig config = tiny();
  config.width = 256;  // units of 12 * 256^2 elements: 3 MiB of fp32, above the cache's 1 MiB floor
  auto off = fsdp::fully_shard(fsdp::testing::make_gpt(config, 5), world_group, block_units().cache_host_blocks(false));
  EXPECT_EQ(mem::block_cache_limit(), 0) << "cache_host_blocks(false) leaves the limit alone";
  auto model = fsdp::fully_shard(fsdp::testing::make_gpt(config, 5), world_group, block_units());
  int64_t largest = 0;
  for (const auto& unit : fsdp::detail::units(model.state()))
    largest = std::max(largest, unit->flat_param().padded_numel());
  EXPECT_EQ(mem::block_cache_limit(), 6 * largest * 4);

  fsdp::models::TokenData data(fsdp::testing::make_token_file("block-cache", 5000, config.vocab), config.context,
                               config.vocab);
  auto [x, y] = data.batch(0, 0, world_group->rank(), world_group->size(), 1, 2);
  auto step = [&] { model.forward(x, y).backward(); };
  // The first step's reductions become the gradient shards; from the second
  // on they are temporaries added into them. (How many blocks end up cached
  // depends on when the communication thread frees a reduction's input, so
  // only the hits are held to a count.)
  step();
  EXPECT_GT(mem::usage().cached_bytes, 0) << "the step's freed unit buffers are kept";
  step();
  const mem::Usage before = mem::usage();
  step();
  const mem::Usage after = mem::usage();
  // Each block is gathered in forward and again in backward, into a cached buffer.
  EXPECT_GE(after.cache_hits - before.cache_hits, 2 * config.layers);
  EXPECT_LE(after.cached_bytes, mem::block_cache_limit());
  mem::empty_block_cache();
  mem::set_block_cache_limit(saved_limit);
}
