// Every sharding strategy at W = 2, 3 and 4 against a single process with
// the global batch: the first step's gradients, the same training, the
// communication of the strategy table to the byte, and the model state of
// the ZeRO formulas to the byte. Also gradient accumulation, clipping, and
// fp16 loss scaling. Besides the tiny preset (whose units pad only at
// W = 3), a model whose units pad at every W (uneven()), so that padding is
// in every comparison.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/unit.h"
#include "fsdp/checkpoint.h"
#include "state_dict/checkpoint_json.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/lr_schedule.h"
#include "fsdp/memory.h"
#include "fsdp/memory_plan.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "test_helpers.h"

using fsdp::ShardingStrategy;
using fsdp::memory::Category;
using fsdp::models::GPT;
using fsdp::models::GPTConfig;
using fsdp::testing::world_group;

namespace {

const std::vector<ShardingStrategy> kAllStrategies = {
    ShardingStrategy::kNoShard,     ShardingStrategy::kZero1,        ShardingStrategy::kShardGradOp,
    ShardingStrategy::kFullShard,   ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2};

using fsdp::testing::tiny;
using fsdp::testing::uneven;

// Hybrid strategies' node: 2 ranks where 2 divides the world (W = 2 is one
// node, W = 4 two, replicated), else the whole world as one node: at W = 3
// that shards over 3 ranks, where every unit pads, rather than over nodes of
// one rank that shard nothing. The replicas' all-reduce at W = 2 and 3 is
// covered by the gradient test, which tries every node size.
int ranks_per_node() { return world_group->size() % 2 == 0 ? 2 : world_group->size(); }

fsdp::FullyShardOptions options_for(ShardingStrategy strategy, torch::ScalarType param_dtype = torch::kFloat,
                                    int per_node = ranks_per_node()) {
  return fsdp::FullyShardOptions()
      .wrap_policy(fsdp::module_type_policy<fsdp::models::BlockImpl>())
      .strategy(strategy)
      .ranks_per_node(per_node)
      .mixed_precision(fsdp::MixedPrecision().param_dtype(param_dtype));
}

using fsdp::testing::gpt_unit_numels;

int64_t padded_sum(const GPTConfig& config, int64_t K) {
  int64_t total = 0;
  for (int64_t n : gpt_unit_numels(config)) total += (n + K - 1) / K * K;
  return total;
}

int shard_size(ShardingStrategy s) { return fsdp::shard_group_size(s, world_group->size(), ranks_per_node()); }

// The full fp32 values of every parameter, gathered unit by unit
// (collective); the padding must have stayed zero through the steps.
std::map<std::string, torch::Tensor> full_values(fsdp::FsdpState& state) {
  std::map<std::string, torch::Tensor> values;
  for (const auto& unit : state.units()) {
    const auto& flat = unit->flat_param();
    torch::Tensor full = flat.gather_full(flat.shard());
    EXPECT_TRUE(fsdp::testing::padding_of(flat, full).eq(0).all().item<bool>())
        << "unit " << unit->display_name() << "'s padding is not zero";
    for (const auto& e : flat.entries()) values[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape);
  }
  return values;
}

fsdp::models::TokenData data_for(const GPTConfig& c) {
  return fsdp::models::TokenData(fsdp::testing::make_token_file("strategies", 20000, c.vocab), c.context, c.vocab);
}

std::string name_of(ShardingStrategy s) { return fsdp::strategy_name(s); }
std::string name_of(const GPTConfig& c) { return c.width == tiny().width ? "tiny" : "uneven"; }

// A sharded GPT and the single-process reference it must track, built from
// the same seed, each with the spec's AdamW.
struct ShardedAndReference {
  ShardedAndReference(fsdp::FullyShardOptions options, const GPTConfig& config = tiny())
      : sharded(fsdp::fully_shard(fsdp::testing::make_gpt(config), world_group, std::move(options))),
        sharded_opt(sharded.parameters(), fsdp::testing::spec_adamw()),
        reference(fsdp::testing::make_gpt(config)),
        reference_params(fsdp::testing::unique_parameters(*reference)),
        reference_opt(reference_params, fsdp::testing::spec_adamw()) {}

  fsdp::FullyShardedModule<fsdp::models::GPTImpl> sharded;
  torch::optim::AdamW sharded_opt;
  GPT reference;
  std::vector<torch::Tensor> reference_params;
  torch::optim::AdamW reference_opt;
};

}  // namespace

// The first step's gradients, gathered over each unit's shard group, equal
// a single process's with the global batch, and the padding's are zero:
// every strategy, on the tiny preset and on a model whose units pad at
// every W, and hybrid with every node size that divides W (from nodes of
// one rank, where the replicas' all-reduce does all the averaging, to one
// node of the whole world). The training below compares losses and
// weights, which cannot show a gradient that is uniformly wrong: Adam's
// update is scale-invariant, so a sum where a mean belongs trains nearly
// alike. Tolerance as FullShard's gradient check, relative 1e-4 per tensor
// (float rounding is ~1e-6); a sum instead of a mean is off by a factor 2+.
TEST(Strategies, FirstStepGradientsEqualOneProcessWithTheGlobalBatch) {
  const int W = world_group->size(), r = world_group->rank();
  const int64_t B = 2;
  for (const GPTConfig& config : {tiny(), uneven()}) {
    auto data = data_for(config);
    auto [x, y] = data.batch(0, 0, r, W, 1, B);
    auto [gx, gy] = data.batch(0, 0, 0, 1, 1, W * B);
    GPT reference = fsdp::testing::make_gpt(config);
    reference->forward(gx, gy).backward();
    for (ShardingStrategy strategy : kAllStrategies) {
      std::vector<int> node_sizes = {ranks_per_node()};
      if (fsdp::is_hybrid(strategy)) {
        node_sizes.clear();
        for (int n = 1; n <= W; ++n)
          if (W % n == 0) node_sizes.push_back(n);
      }
      for (int per_node : node_sizes) {
        const std::string context = " (" + name_of(config) + ", " + name_of(strategy) +
                                    (fsdp::is_hybrid(strategy) ? ", nodes of " + std::to_string(per_node) : "") + ")";
        auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(config), world_group,
                                         options_for(strategy, torch::kFloat, per_node));
        sharded.forward(x, y).backward();
        fsdp::testing::expect_gradients_match(sharded.state(), *reference, 1e-4, context);
      }
    }
  }
}

// Tolerances as in FullShard.TrainsTheSameModelAsOneProcessWithTheGlobalBatch:
// relative 1e-5 per loss, absolute 1e-4 on the final weights. On the model
// whose units pad at every W: the optimizer steps padded shards, whose
// padding must stay zero.
TEST(Strategies, EveryStrategyTrainsTheSameModelAsOneProcess) {
  const int W = world_group->size(), r = world_group->rank();
  const int64_t B = 2, steps = 10;
  const GPTConfig config = uneven();
  auto data = data_for(config);
  for (ShardingStrategy strategy : kAllStrategies) {
    SCOPED_TRACE(name_of(strategy));
    ShardedAndReference pair(options_for(strategy), config);
    auto& [sharded, sharded_opt, reference, reference_params, reference_opt] = pair;
    for (int64_t step = 0; step < steps; ++step) {
      auto [x, y] = data.batch(step, 0, r, W, 1, B);
      torch::Tensor loss = sharded.forward(x, y);
      loss.backward();
      sharded_opt.step();
      sharded_opt.zero_grad();
      sharded.state().check_idle();
      world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();

      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>())
          << "step " << step;
    }
    for (const auto& [name, value] : full_values(sharded.state())) {
      EXPECT_LT((value - reference->named_parameters()[name].detach()).abs().max().item<double>(), 1e-4) << name;
    }
  }
}

// The bytes each collective kind moves in one (steady-state) step, counted
// by the communicator, against the strategy table. All fp32 here but the
// last case, where bf16 params halve the gathers and the reduction.
TEST(Strategies, CommunicationPerStepMatchesTheStrategyTable) {
  const int W = world_group->size(), r = world_group->rank();
  auto data = data_for(tiny());
  struct Case {
    ShardingStrategy strategy;
    torch::ScalarType dtype;
  };
  std::vector<Case> cases;
  for (auto s : kAllStrategies) cases.push_back({s, torch::kFloat});
  cases.push_back({ShardingStrategy::kFullShard, torch::kBFloat16});
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c.strategy) + (c.dtype == torch::kFloat ? "" : " bf16"));
    auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(tiny()), world_group, options_for(c.strategy, c.dtype));
    torch::optim::AdamW optimizer(sharded.parameters(), fsdp::testing::spec_adamw());
    fsdp::CommStats stats;
    for (int step = 0; step < 3; ++step) {  // the last step is counted
      sharded.state().reset_comm_stats();
      auto [x, y] = data.batch(step, 0, r, W, 1, 2);
      sharded.forward(x, y).backward();
      optimizer.step();
      optimizer.zero_grad();
      stats = sharded.state().comm_stats();
    }
    const int64_t p = c.dtype == torch::kFloat ? 4 : 2;  // param and reduce dtype bytes
    const int64_t K = shard_size(c.strategy);
    const int64_t padded = padded_sum(tiny(), K);
    int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
    switch (c.strategy) {
      case ShardingStrategy::kNoShard: all_reduce = p * padded; break;
      case ShardingStrategy::kZero1: all_reduce = p * padded, all_gather = p * padded; break;
      case ShardingStrategy::kShardGradOp: all_gather = p * padded, reduce_scatter = p * padded; break;
      case ShardingStrategy::kFullShard: all_gather = 2 * p * padded, reduce_scatter = p * padded; break;
      case ShardingStrategy::kHybridShard:
      case ShardingStrategy::kHybridShardZero2:
        all_gather = (c.strategy == ShardingStrategy::kHybridShard ? 2 : 1) * p * padded;
        reduce_scatter = p * padded;
        if (W > K) all_reduce = p * padded / K;  // the shard, across nodes
        break;
    }
    EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllGather)], all_gather);
    EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kReduceScatter)], reduce_scatter);
    EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllReduce)], all_reduce);
    EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kBroadcast)], 0);
    // The planner's figures are the same.
    const fsdp::CommBytes planned = fsdp::estimate_comm_per_step(gpt_unit_numels(tiny()), c.strategy, W,
                                                                 ranks_per_node(),
                                                                 fsdp::MixedPrecision().param_dtype(c.dtype));
    EXPECT_EQ(planned.all_gather, all_gather);
    EXPECT_EQ(planned.reduce_scatter, reduce_scatter);
    EXPECT_EQ(planned.all_reduce, all_reduce);
  }
}

// Per-rank model state after a step, by category, measured by the
// allocator: equal to the README's ZeRO table, written out here for fp32
// and bf16 params, and to estimate_model_state (the planner's figures). On
// the tiny preset and on a model whose units pad at every W, so that the
// padded sizes (Np, S) differ from the unpadded (N, N/K) wherever they can.
TEST(Strategies, ModelStateMatchesTheZeroFormulasToTheByte) {
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

// A micro-steps of batch B, reduced once, equal one step of batch A*B: with
// the reduction skipped (no_sync) on the first micro-steps for every
// strategy, and the skipped reductions really not sent.
TEST(Strategies, GradientAccumulationEqualsTheLargerBatch) {
  const int W = world_group->size(), r = world_group->rank();
  const int64_t A = 2, B = 1, steps = 6;
  auto data = data_for(tiny());
  for (ShardingStrategy strategy : {ShardingStrategy::kNoShard, ShardingStrategy::kZero1, ShardingStrategy::kFullShard,
                                    ShardingStrategy::kHybridShard}) {
    SCOPED_TRACE(name_of(strategy));
    ShardedAndReference pair(options_for(strategy));
    auto& [sharded, sharded_opt, reference, reference_params, reference_opt] = pair;
    for (int64_t step = 0; step < steps; ++step) {
      torch::Tensor loss_sum = torch::zeros({});
      sharded.state().reset_comm_stats();
      for (int64_t m = 0; m < A; ++m) {
        sharded.state().set_requires_gradient_sync(m == A - 1);
        auto [x, y] = data.batch(step, m, r, W, A, B);
        torch::Tensor loss = sharded.forward(x, y) / static_cast<double>(A);
        loss.backward();
        loss_sum += loss.detach();
        if (m == 0) {
          auto stats = sharded.state().comm_stats();
          EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kReduceScatter)] +
                        stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllReduce)],
                    0)
              << "a reduction was sent on a no_sync micro-step";
        }
      }
      sharded_opt.step();
      sharded_opt.zero_grad();
      world_group->all_reduce(loss_sum, fsdp::ReduceOp::kAvg)->wait();

      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * A * B);  // the same sequences, in one batch
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      EXPECT_NEAR(loss_sum.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>())
          << "step " << step;
    }
  }
}

// The global norm over every shard and every rank, and the clipped update,
// equal a single process clipping the same gradient. On the model whose
// units pad at every W: padding contributes zero to the norm.
TEST(Strategies, ClippingUsesTheGlobalNormAndEqualsASingleProcessClip) {
  const int W = world_group->size(), r = world_group->rank();
  const double max_norm = 0.05;  // well below the GPT's gradient norm (~1), so every step clips
  const GPTConfig config = uneven();
  auto data = data_for(config);
  for (ShardingStrategy strategy : kAllStrategies) {
    SCOPED_TRACE(name_of(strategy));
    ShardedAndReference pair(options_for(strategy), config);
    auto& [sharded, sharded_opt, reference, reference_params, reference_opt] = pair;
    for (int64_t step = 0; step < 4; ++step) {
      auto [x, y] = data.batch(step, 0, r, W, 1, 2);
      torch::Tensor loss = sharded.forward(x, y);
      loss.backward();
      const double norm = fsdp::clip_grad_norm_(sharded.state(), max_norm);
      sharded_opt.step();
      sharded_opt.zero_grad();
      world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();

      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * 2);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      const double reference_norm = torch::nn::utils::clip_grad_norm_(reference_params, max_norm);
      reference_opt.step();
      reference_opt.zero_grad();
      ASSERT_GT(reference_norm, 2 * max_norm) << "the test must clip";
      EXPECT_NEAR(norm, reference_norm, 1e-5 * reference_norm) << "step " << step;
      EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>())
          << "step " << step;
      // Every rank clipped by the same factor: the same norm everywhere.
      torch::Tensor norms = torch::empty({W}, torch::kDouble);
      world_group->all_gather(norms, torch::tensor({norm}, torch::kDouble))->wait();
      EXPECT_EQ(norms.min().item<double>(), norms.max().item<double>());
    }
  }
}

// Weight decay through TrainStep, element range by element range of the
// flat shards (which mix matrices with biases and norm gains), equals torch
// AdamW with two parameter groups: decay on the parameters of 2 or more
// dimensions, none on the rest. Every strategy, on the model whose units pad
// at every W. The decay is large and the lr changes every step (a warmup),
// so a decay of the vectors (the norm gains start at 1), a missed or doubled
// one, or one at a stale lr is far outside the tolerance.
TEST(Strategies, WeightDecayOfMatricesOnlyEqualsAdamWWithTwoParameterGroups) {
  const int W = world_group->size(), r = world_group->rank();
  const double weight_decay = 1.0;
  const auto schedule = fsdp::LrSchedule().lr(1e-2).warmup_steps(4);
  const GPTConfig config = uneven();
  auto data = data_for(config);
  for (ShardingStrategy strategy : kAllStrategies) {
    SCOPED_TRACE(name_of(strategy));
    auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(config), world_group, options_for(strategy));
    torch::optim::AdamW sharded_opt(sharded.parameters(), fsdp::testing::spec_adamw());
    fsdp::TrainStep train_step(sharded, sharded_opt,
                               fsdp::TrainStepOptions().weight_decay(weight_decay).gather_rank_figures(false));
    GPT reference = fsdp::testing::make_gpt(config);
    std::vector<torch::Tensor> matrices, vectors;
    for (const auto& [name, p] : fsdp::unique_named_parameters(*reference)) {
      (p.dim() >= 2 ? matrices : vectors).push_back(p);
    }
    ASSERT_FALSE(matrices.empty() || vectors.empty());
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(
                                      fsdp::testing::spec_adamw().weight_decay(weight_decay)));
    groups.emplace_back(vectors, std::make_unique<torch::optim::AdamWOptions>(fsdp::testing::spec_adamw()));
    torch::optim::AdamW reference_opt(std::move(groups), fsdp::testing::spec_adamw());
    for (int64_t step = 0; step < 6; ++step) {
      fsdp::set_learning_rate(sharded_opt, schedule.lr_at(step));
      fsdp::set_learning_rate(reference_opt, schedule.lr_at(step));
      auto [x, y] = data.batch(step, 0, r, W, 1, 2);
      const fsdp::StepResult result = train_step([&](int64_t) { return sharded.forward(x, y); });

      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * 2);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      EXPECT_NEAR(result.loss, reference_loss.item<double>(), 1e-5 * reference_loss.item<double>())
          << "step " << step;
    }
    for (const auto& [name, value] : full_values(sharded.state())) {
      EXPECT_LT((value - reference->named_parameters()[name].detach()).abs().max().item<double>(), 1e-4) << name;
    }
  }
}

// The optimizer's own decay on top of TrainStep's would decay twice (and
// every tensor): refused, saying so.
TEST(Strategies, WeightDecayRefusesAnOptimizerThatDecaysItself) {
  auto sharded = fsdp::fully_shard(fsdp::testing::make_gpt(tiny()), world_group, options_for(ShardingStrategy::kFullShard));
  torch::optim::AdamW optimizer(sharded.parameters(), torch::optim::AdamWOptions(1e-3));  // weight_decay 0.01
  try {
    fsdp::TrainStep(sharded, optimizer, fsdp::TrainStepOptions().weight_decay(0.1));
    ADD_FAILURE() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(fsdp::error_message(e).find("optimizer's own weight_decay must then be 0"), std::string::npos)
        << fsdp::error_message(e);
  }
  fsdp::TrainStep(sharded, optimizer, fsdp::TrainStepOptions());  // its own decay alone is fine
}

// fp16 gradient reduction with dynamic loss scaling, started at a scale
// that overflows fp16: the first steps are skipped on every rank alike, the
// scale backs off until steps go through, and training then proceeds
// without NaN or divergence.
TEST(Strategies, Fp16LossScalingSkipsOverflowingStepsOnEveryRankAlike) {
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

TEST(Strategies, NamesRoundTripAndUnknownNamesAreRefused) {
  for (auto s : kAllStrategies) EXPECT_EQ(fsdp::parse_strategy(fsdp::strategy_name(s)), s);
  try {
    fsdp::parse_strategy("zero4");
    ADD_FAILURE();
  } catch (const c10::Error& e) {
    EXPECT_NE(fsdp::error_message(e).find("unknown sharding strategy 'zero4': expected one of no_shard, zero1"),
              std::string::npos);
  }
  EXPECT_THROW(fsdp::parse_dtype("fp8"), c10::Error);
}

// A backward that throws never reaches its end-of-backward callback; the
// next forward must put every unit back to rest and train on normally.
TEST(Strategies, AFailedBackwardLeavesTheModelUsable) {
  const int W = world_group->size(), r = world_group->rank();
  auto data = data_for(tiny());
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kZero1}) {
    SCOPED_TRACE(name_of(strategy));
    ShardedAndReference pair(options_for(strategy));
    auto& [sharded, sharded_opt, reference, reference_params, reference_opt] = pair;
    auto [x, y] = data.batch(0, 0, r, W, 1, 2);
    torch::Tensor loss = sharded.forward(x, y);
    loss.register_hook([](const torch::Tensor& grad) -> torch::Tensor { TORCH_CHECK(false, "injected failure"); });
    EXPECT_THROW(loss.backward(), c10::Error);
    // Train as if nothing happened, against a reference that saw nothing.
    for (int64_t step = 0; step < 3; ++step) {
      auto [sx, sy] = data.batch(step, 0, r, W, 1, 2);
      torch::Tensor l = sharded.forward(sx, sy);
      l.backward();
      sharded_opt.step();
      sharded_opt.zero_grad();
      sharded.state().check_idle();
      world_group->all_reduce(l, fsdp::ReduceOp::kAvg)->wait();
      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * 2);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      EXPECT_NEAR(l.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>());
    }
  }
}

namespace {

// Rewrites a checkpoint's file through `edit` (which may change, add or drop
// tensors), and lists the new file's checksum in a re-checksummed metadata,
// so that only the contents are wrong.
void tamper(const std::string& checkpoint, const std::string& file,
            const std::function<void(std::vector<fsdp::safetensors::TensorSpec>&, std::vector<torch::Tensor>&)>& edit) {
  const std::string path = checkpoint + "/" + file;
  std::vector<fsdp::safetensors::TensorSpec> specs;
  std::vector<torch::Tensor> values;
  {
    fsdp::safetensors::Reader reader(path);
    for (const auto& t : reader.tensors()) {
      specs.push_back(t.spec);
      values.push_back(reader.read(t.spec.name));
    }
  }
  edit(specs, values);
  fsdp::safetensors::Writer writer(path, specs);
  for (const auto& v : values) writer.write(v);
  writer.commit();
  nlohmann::json meta;
  std::ifstream(checkpoint + "/metadata.json") >> meta;
  meta["files"][file] = fsdp::safetensors::hex64(writer.checksum());
  fsdp::write_checkpoint_metadata(checkpoint, meta);
}

size_t index_of(const std::vector<fsdp::safetensors::TensorSpec>& specs, const std::string& name) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return i;
  throw std::runtime_error("no tensor " + name);
}

void expect_refused(const std::string& checkpoint, const std::string& what) {
  try {
    fsdp::SavedCheckpoint saved(checkpoint);
    ADD_FAILURE() << "a tampered checkpoint was accepted; expected: " << what;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(what), std::string::npos) << e.what_without_backtrace();
  }
}

}  // namespace

// Files that are intact as files (their checksums match) but hold the wrong
// tensors are refused by name, in both formats; the untouched checkpoint loads.
TEST(Strategies, CheckpointsWithWrongTensorsAreRefusedNamingFileAndTensor) {
  namespace fs = std::filesystem;
  const std::string dir = "/tmp/fsdp_test_tamper_w" + std::to_string(world_group->size());
  auto model = fsdp::fully_shard(fsdp::testing::make_gpt(tiny()), world_group, options_for(ShardingStrategy::kFullShard));
  torch::optim::AdamW optimizer(model.parameters(), fsdp::testing::spec_adamw());
  auto data = data_for(tiny());
  auto [x, y] = data.batch(0, 0, world_group->rank(), world_group->size(), 1, 2);
  model.forward(x, y).backward();
  optimizer.step();
  if (world_group->rank() == 0) fs::remove_all(dir);
  world_group->barrier()->wait();
  const std::string sharded = fsdp::save_checkpoint(model.state(), optimizer, dir + "/sharded", 1);
  const std::string full =
      fsdp::save_checkpoint(model.state(), optimizer, dir + "/full", 1, {}, fsdp::CheckpointFormat::kFull);
  fsdp::load_checkpoint(model.state(), optimizer, sharded);
  fsdp::load_checkpoint(model.state(), optimizer, full);
  world_group->barrier()->wait();
  if (world_group->rank() == 0) {
    auto copy = [&](const std::string& from, const std::string& name) {
      fs::copy(from, dir + "/" + name, fs::copy_options::recursive);
      return dir + "/" + name;
    };
    std::string c = copy(sharded, "dtype");
    tamper(c, "shard-0.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "u0.exp_avg");
      specs[i].dtype = torch::kBFloat16;
      values[i] = values[i].to(torch::kBFloat16);
    });
    expect_refused(c, "shard-0.safetensors': tensor 'u0.exp_avg' is BFloat16 of shape");
    c = copy(sharded, "extra");
    tamper(c, "shard-0.safetensors", [](auto& specs, auto& values) {
      specs.push_back({"u9.param", torch::kFloat, {3}});
      values.push_back(torch::zeros({3}));
    });
    expect_refused(c, "shard-0.safetensors' has a tensor 'u9.param' that the checkpoint's layout does not have");
    c = copy(full, "missing");
    tamper(c, "model.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "transformer.wte.weight");
      specs.erase(specs.begin() + i);
      values.erase(values.begin() + i);
    });
    expect_refused(c, "model.safetensors' has no tensor 'transformer.wte.weight'");
    c = copy(full, "shape");
    tamper(c, "optimizer.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "transformer.wte.weight.exp_avg");
      specs[i].shape = {values[i].numel()};
      values[i] = values[i].flatten();
    });
    expect_refused(c, "optimizer.safetensors': tensor 'transformer.wte.weight.exp_avg' is Float of shape [16384]");
    // A file of another checkpoint, intact in itself, is refused too.
    c = copy(full, "swapped");
    fs::copy(full + "/model.safetensors", c + "/optimizer.safetensors", fs::copy_options::overwrite_existing);
    expect_refused(c, "optimizer.safetensors' has checksum");
    fs::remove_all(dir);
  }
  world_group->barrier()->wait();
}
