// The optimizer step of a sharded model at W = 2, 3 and 4: TrainStep
// against the hand-written step and its micro-steps against the whole batch,
// gradient accumulation against the larger batch, clipping by the global
// norm, weight decay of matrices only, and the refusals. The kernels
// themselves (FusedAdamW, queued clipping) are in test_optimizer_kernels.cpp.

#include <gtest/gtest.h>

#include <string>

#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/grad_utils.h"
#include "fsdp/lr_schedule.h"
#include "optim/optimizer_state.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "core/unit_plan.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::ShardingStrategy;
using fsdp::testing::world_group;
using fsdp::testing::ShardedAndReference;
using fsdp::testing::batch;
using fsdp::testing::block_units;
using fsdp::testing::data_for;
using fsdp::testing::expect_same_params;
using fsdp::testing::full_params;
using fsdp::testing::full_values;
using fsdp::testing::kAllStrategies;
using fsdp::testing::make_gpt;
using fsdp::testing::name_of;
using fsdp::testing::options_for;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::token_data;
using fsdp::testing::uneven;

TEST(TrainStep, EqualsTheHandWrittenStep) {
  auto a = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  auto b = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW opt_a(a.parameters(), spec_adamw()), opt_b(b.parameters(), spec_adamw());
  fsdp::TrainStep step_a(a, opt_a, fsdp::TrainStepOptions().clip_grad_norm(0.5));
  for (int64_t step = 0; step < 3; ++step) {
    fsdp::StepResult r = step_a([&](int64_t micro) {
      auto [x, y] = batch(token_data(), step, micro, 1, 2);
      return a(x, y);
    });
    // The same step written out by hand.
    auto [x, y] = batch(token_data(), step, 0, 1, 2);
    torch::Tensor loss = b(x, y);
    loss.backward();
    const double norm = fsdp::clip_grad_norm_(b.state(), 0.5);
    opt_b.step();
    opt_b.zero_grad();
    torch::Tensor mean = loss.detach().to(torch::kDouble);
    world_group->all_reduce(mean, fsdp::ReduceOp::kAvg)->wait();
    EXPECT_EQ(r.loss, mean.item<double>()) << "step " << step;
    ASSERT_TRUE(r.grad_norm.has_value());
    EXPECT_EQ(*r.grad_norm, norm);
    EXPECT_TRUE(r.stepped);
    EXPECT_FALSE(r.loss_scale.has_value());
    ASSERT_EQ(static_cast<int>(r.per_rank.size()), world_group->size());
    EXPECT_GT(r.per_rank[world_group->rank()].model_state_bytes, 0);
    EXPECT_GT(r.comm.bytes[static_cast<size_t>(fsdp::CollectiveKind::kReduceScatter)], 0);
  }
  expect_same_params(a.state(), b.state(), "after 3 steps");
}

TEST(TrainStep, MicroStepsEqualTheWholeBatch) {
  // Two micro-batches of 1 per rank train the model one batch of 2 does
  // (the same sequences, the spec's order), with and without no_sync. SGD:
  // its update is linear in the gradient, so only float rounding differs
  // (Adam would turn the rounding noise of gradients that are zero in exact
  // arithmetic, such as the key biases', into whole steps).
  for (bool no_sync : {false, true}) {
    auto whole = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
    auto split = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
    torch::optim::SGD opt_whole(whole.parameters(), torch::optim::SGDOptions(0.5)),
        opt_split(split.parameters(), torch::optim::SGDOptions(0.5));
    fsdp::TrainStep step_whole(whole, opt_whole);
    fsdp::TrainStep step_split(split, opt_split, fsdp::TrainStepOptions().micro_steps(2).no_sync(no_sync));
    EXPECT_EQ(step_split.syncs_only_last_micro_step(), no_sync);
    for (int64_t step = 0; step < 2; ++step) {
      // Micro-step m of rank r takes sequences (m*W + r)*B..; one batch of 2
      // per rank takes r*2, r*2+1 of a global batch of 2W. They are the same
      // set of sequences only at W = 1, so compare against whole batches
      // laid out the way the micro-steps take them.
      const auto r_whole = step_whole([&](int64_t) {
        auto [x0, y0] = batch(token_data(), step, 0, 2, 1);
        auto [x1, y1] = batch(token_data(), step, 1, 2, 1);
        return whole(torch::cat({x0, x1}), torch::cat({y0, y1}));
      });
      const auto r_split = step_split([&](int64_t micro) {
        auto [x, y] = batch(token_data(), step, micro, 2, 1);
        return split(x, y);
      });
      EXPECT_NEAR(r_split.loss, r_whole.loss, 1e-5 * r_whole.loss) << "no_sync " << no_sync;
    }
    auto pw = full_params(whole.state()), ps = full_params(split.state());
    EXPECT_FALSE(torch::equal(pw.at("transformer.h.0.mlp.c_fc.weight"),
                              make_gpt(tiny())->named_parameters()["transformer.h.0.mlp.c_fc.weight"]))
        << "the model did not train";
    for (const auto& [name, value] : pw) {
      EXPECT_LT((ps.at(name) - value).abs().max().item<double>(), 1e-6) << name << " no_sync " << no_sync;
    }
  }
}

TEST(TrainStep, RefusesOptimizersItCannotShard) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::LBFGS lbfgs(model.parameters(), torch::optim::LBFGSOptions(1.0));
  try {
    fsdp::TrainStep step(model, lbfgs);
    ADD_FAILURE() << "LBFGS was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("torch::optim::LBFGS"), std::string::npos) << e.what();
  }
  // An optimizer over the module's own parameters (not the shards).
  GPT plain = make_gpt(tiny());
  torch::optim::AdamW wrong(plain->parameters(), spec_adamw());
  EXPECT_THROW({ fsdp::TrainStep refused(model, wrong); }, c10::Error);
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_NO_THROW({ fsdp::TrainStep accepted(model, sgd); });
}

// A micro-steps of batch B, reduced once, equal one step of batch A*B: with
// the reduction skipped (no_sync) on the first micro-steps for every
// strategy, and the skipped reductions really not sent.
TEST(GradientAccumulation, EqualsTheLargerBatch) {
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
TEST(Clipping, UsesTheGlobalNormAndEqualsASingleProcessClip) {
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
TEST(WeightDecay, OfMatricesOnlyEqualsAdamWWithTwoParameterGroups) {
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
TEST(WeightDecay, RefusesAnOptimizerThatDecaysItself) {
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
