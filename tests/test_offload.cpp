// Offload of a sharded model: to the CPU at W = 1 to 4 (the same
// losses bit for bit, shards, gradients and optimizer state on the host,
// refused for strategies that keep whole parameters), and to disk at
// W = 2, 3 and 4 (a plain backward refused, and the same as memory through
// evaluation and state-dict loads). The disk store itself is tested in
// test_disk_store.cpp.

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "offload/nvme_offload.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "core/strategy_rules.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::testing::world_group;
using fsdp::testing::block_units;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::train_losses;

// Offload moves where the shard lives, not what is computed: the same
// float operations in the same order, so the losses are bit-identical.
TEST(CpuOffload, TrainsExactlyAsWithoutOffload) {
  for (auto strategy : {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp}) {
    const auto plain = train_losses(block_units(strategy), 4, torch::kCPU);
    const auto offloaded = train_losses(block_units(strategy).offload(fsdp::OffloadPolicy::cpu()), 4, torch::kCPU);
    EXPECT_EQ(plain, offloaded) << fsdp::enum_name(strategy);
  }
}

TEST(CpuOffload, ShardsGradientsAndOptimizerStateStayOnTheHost) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units().offload(fsdp::OffloadPolicy::cpu()));
  fsdp::FusedAdamW optimizer(model.parameters(), spec_adamw());
  const GPTConfig config = tiny();
  torch::Tensor x = torch::randint(config.vocab, {2, config.context}, torch::kLong);
  model.forward(x, x).backward();
  optimizer.step();
  for (const auto& shard : model.parameters()) {
    EXPECT_TRUE(shard.device().is_cpu());
    ASSERT_TRUE(shard.grad().defined());
    EXPECT_TRUE(shard.grad().device().is_cpu());
  }
}

TEST(CpuOffload, IsRefusedForStrategiesThatKeepWholeParameters) {
  for (auto strategy : {fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kZero1}) {
    GPT gpt = make_gpt(tiny());
    try {
      fsdp::fully_shard(gpt, world_group, block_units(strategy).offload(fsdp::OffloadPolicy::cpu()));
      ADD_FAILURE() << "OffloadPolicy::cpu() with " << fsdp::enum_name(strategy) << " was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(fsdp::error_message(e).find("OffloadPolicy::cpu() needs a sharded strategy"), std::string::npos)
          << fsdp::error_message(e);
    }
  }
}

namespace {

// A disk-offload test's scratch folder (one per run of the suite, made
// here) and the offload of parameters and optimizer state into it, in
// small blocks.
std::string offload_test_dir(const std::string& name) {
  const std::string dir = "/tmp/fsdp_offload_" + name + "_" + std::to_string(::getppid());
  std::filesystem::create_directories(dir);
  return dir;
}
fsdp::NvmeOffloadOptions offload_everything_to(const std::string& dir) {
  return fsdp::NvmeOffloadOptions(dir).optimizer_state(true).params(true).store(
      fsdp::offload::DiskStoreOptions(dir).block_bytes(64 << 10));
}

}  // namespace

// A user's own loop on a disk-offloaded model (loss.backward(); then their
// optimizer's step) cannot train: no step of theirs brings each unit's
// state from disk into memory around its update. So the backward is refused,
// naming fsdp::TrainStep, before it changes anything: the same model then
// trains through TrainStep, bit for bit as the in-memory one.
TEST(DiskOffload, RefusesAPlainBackwardAndStaysUsable) {
  const int W = world_group->size(), r = world_group->rank();
  const GPTConfig config = tiny();
  const std::string dir = offload_test_dir("plain");
  fsdp::models::TokenData data(fsdp::testing::make_token_file("offload-plain", 20000, config.vocab), config.context,
                               config.vocab);
  std::vector<double> losses[2];
  for (int offloaded = 0; offloaded < 2; ++offloaded) {
    auto options = block_units();
    if (offloaded) options.offload(fsdp::OffloadPolicy::nvme(offload_everything_to(dir)));
    auto model = fsdp::fully_shard(make_gpt(config), world_group, options);
    fsdp::FusedAdamW optimizer(model.parameters(), spec_adamw());
    auto [x, y] = data.batch(0, 0, r, W, 1, 2);
    torch::Tensor loss = model.forward(x, y);  // both models run it: the same draws of every generator
    if (offloaded) {
      std::string error;
      try {
        loss.backward();
      } catch (const c10::Error& e) {
        error = e.what_without_backtrace();
      }
      EXPECT_NE(error.find("disk offload (OffloadPolicy::nvme) trains through fsdp::TrainStep"), std::string::npos)
          << "a plain backward on a disk-offloaded model: " << (error.empty() ? "accepted" : error);
      for (const auto& shard : model.parameters()) EXPECT_FALSE(shard.grad().defined()) << "a refused backward left a gradient";
    }
    loss = torch::Tensor();
    fsdp::TrainStep train_step(model, optimizer);
    for (int64_t step = 0; step < 3; ++step) {
      auto [sx, sy] = data.batch(1 + step, 0, r, W, 1, 2);
      losses[offloaded].push_back(train_step([&](int64_t) { return model.forward(sx, sy); }).loss);
    }
  }
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_EQ(losses[1][i], losses[0][i]) << "step " << i;
  world_group->barrier()->wait();
  if (r == 0) std::filesystem::remove_all(dir);
}

// A read-ahead that could not grow to its most, or a share of the step out
// of [0, 1], is refused before fully_shard touches a parameter, naming the setting.
TEST(DiskOffload, RefusesAReadAheadThatCannotGrow) {
  const std::string dir = offload_test_dir("read_ahead");
  for (const auto& [offload, expected] :
       {std::pair{offload_everything_to(dir).read_ahead(3).max_read_ahead(2),
                  "NvmeOffloadOptions::max_read_ahead must be 0 (fixed) or at least read_ahead (3), got 2"},
        {offload_everything_to(dir).deepen_above(1.5), "NvmeOffloadOptions::deepen_above is a share of the step, from 0 to 1"}}) {
    auto gpt = make_gpt(tiny());
    const torch::Tensor before = gpt->parameters()[0].clone();
    std::string error;
    try {
      fsdp::fully_shard(gpt, world_group, block_units().offload(fsdp::OffloadPolicy::nvme(offload)));
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
    EXPECT_NE(error.find(expected), std::string::npos) << (error.empty() ? "accepted" : error);
    EXPECT_TRUE(torch::equal(gpt->parameters()[0], before)) << "the refused model changed";
  }
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
}

// The library's use of disk offload beyond the trainer's: between steps, an
// evaluation (a forward whose last gather reads the next unit ahead), then a
// change through a sharded state dict (written back to the scratch file),
// then training again. The offloaded model must compute what the in-memory
// one computes, bit for bit: a parameter read issued ahead of a write-back
// would hand the next gather the old values.
TEST(DiskOffload, EqualsMemoryThroughEvaluationAndStateDictLoads) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("offload-loads", 20000, config.vocab), config.context,
                               config.vocab);
  const std::string dir = offload_test_dir("loads");
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    std::vector<double> losses[2];
    for (int offloaded = 0; offloaded < 2; ++offloaded) {
      fsdp::MixedPrecision mp;
      mp.param_dtype(dtype);
      auto options = block_units().mixed_precision(mp);
      if (offloaded) options.offload(fsdp::OffloadPolicy::nvme(offload_everything_to(dir)));
      auto model = fsdp::fully_shard(make_gpt(config), world_group, options);
      ASSERT_EQ(model.state().nvme_offload().has_value(), offloaded == 1);
      fsdp::FusedAdamW optimizer(model.parameters(), spec_adamw());
      fsdp::TrainStep train_step(model, optimizer, fsdp::TrainStepOptions().weight_decay(0.1));
      for (int64_t step = 0; step < 4; ++step) {
        auto [x, y] = data.batch(step, 0, r, W, 1, 2);
        losses[offloaded].push_back(train_step([&](int64_t) { return model.forward(x, y); }).loss);
        {
          torch::NoGradGuard no_grad;
          auto [vx, vy] = data.batch(100 + step, 0, r, W, 1, 2);
          losses[offloaded].push_back(model.forward(vx, vy).item<double>());
        }
        fsdp::ShardedStateDict dict = fsdp::sharded_state_dict(model.state());
        for (auto& item : dict) item.value().local.mul_(0.99);
        fsdp::load_sharded_state_dict(model.state(), dict);
      }
    }
    ASSERT_EQ(losses[0].size(), losses[1].size());
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_EQ(losses[1][i], losses[0][i]) << fsdp::enum_name(dtype) << ": loss " << i << " (steps and evaluations)";
    }
  }
  world_group->barrier()->wait();
  if (r == 0) std::filesystem::remove_all(dir);
}

// Stepping in backward (NvmeOffloadOptions::step_in_backward, the default)
// moves each unit's update into the last backward of the step, as soon as
// its gradient is reduced, and frees that gradient at once. A step that
// clips or scales the loss (it needs every gradient first) writes each
// gradient out as it arrives, prepared (unscaled, its sum of squares
// kept), and leaves each unit's update for its next all-gather. Either
// changes when the update runs, not what it computes: for every strategy
// disk offload allows, with accumulation, the matrices' decay, clipping and
// loss scaling, the losses (and an evaluation after the last step, which
// takes the last pending updates) equal the in-memory run's and the
// step-after-backward run's bit for bit. After the step no gradient shard
// is left in memory (the step after backward keeps all of them until the
// optimizer runs); no_shard, whose whole gradient lives in a buffer of its
// own anyway, steps after backward.
TEST(DiskOffload, StepsEachUnitInBackwardAsItsGradientArrives) {
  const int W = world_group->size(), r = world_group->rank();
  const GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("offload-in-backward", 20000, config.vocab),
                               config.context, config.vocab);
  const std::string dir = offload_test_dir("in_backward");
  std::vector<fsdp::ShardingStrategy> strategies = {fsdp::ShardingStrategy::kFullShard,
                                                    fsdp::ShardingStrategy::kShardGradOp,
                                                    fsdp::ShardingStrategy::kNoShard};
  if (W % 2 == 0) strategies.push_back(fsdp::ShardingStrategy::kHybridShard);
  enum Placement { kMemory, kInBackward, kAfterBackward };
  for (const auto strategy : strategies) {
    for (const auto& [clip, scaling] : {std::pair{0.0, false}, {0.5, false}, {0.5, true}}) {
      std::vector<double> losses[3];
      for (const Placement placement : {kMemory, kInBackward, kAfterBackward}) {
        auto options = block_units(strategy);
        if (strategy == fsdp::ShardingStrategy::kHybridShard) options.ranks_per_node(2);
        const bool params = !fsdp::keeps_params_unsharded(strategy);
        if (placement != kMemory) {
          // In backward, the read-ahead deepens after every step from the
          // second on (deepen_above 0), 1 to 3 units: at any depth, the same
          // numbers. After backward: asked, or (loss scaled) for want of room
          // in the scratch file to write the gradients out.
          const bool no_gradient_slots = placement == kAfterBackward && scaling;
          options.offload(fsdp::OffloadPolicy::nvme(offload_everything_to(dir)
                                   .params(params)
                                   .read_ahead(placement == kInBackward ? 1 : 3)
                                   .max_read_ahead(placement == kInBackward ? 3 : 0)
                                   .deepen_above(0)
                                   .step_in_backward(placement == kInBackward || no_gradient_slots)
                                   .gradient_slots(!no_gradient_slots)));
        }
        auto model = fsdp::fully_shard(make_gpt(config), world_group, options);
        fsdp::FusedAdamW optimizer(model.parameters(), spec_adamw());
        fsdp::TrainStep train_step(model, optimizer,
                                   fsdp::TrainStepOptions().micro_steps(2).weight_decay(0.1).clip_grad_norm(clip).loss_scaling(
                                       scaling));
        const std::string what = std::string(fsdp::enum_name(strategy)) + (clip > 0 ? ", clipped" : "") +
                                 (scaling ? ", loss scaled" : "") +
                                 (placement == kInBackward ? ", in backward" : ", after backward");
        for (int64_t step = 0; step < 3; ++step) {
          const fsdp::StepResult result = train_step([&](int64_t micro) {
            auto [x, y] = data.batch(2 * step + micro, 0, r, W, 1, 2);
            return model.forward(x, y);
          });
          losses[placement].push_back(result.loss);
          if (placement == kMemory) continue;
          EXPECT_EQ(result.offload_read_ahead, placement == kInBackward ? std::max<int>(1, step) : 3)
              << what << ": the units read ahead in step " << step;
          const bool overlapped = placement == kInBackward && !fsdp::keeps_full_gradients(strategy);
          const bool deferred = overlapped && (clip > 0 || scaling);
          EXPECT_EQ(model.state().nvme_offload()->stepped_in_backward, overlapped && !deferred) << what;
          EXPECT_EQ(model.state().nvme_offload()->stepped_before_next_gather, deferred) << what;
          if (overlapped) {
            EXPECT_EQ(result.figures.grad_shard_bytes, 0) << what << ": a gradient shard outlived its unit's step";
          } else {
            EXPECT_GT(result.figures.grad_shard_bytes, 0) << what << ": the gradients are kept for the step";
          }
        }
        torch::NoGradGuard no_grad;  // takes the last step's pending updates
        auto [x, y] = data.batch(7, 0, r, W, 1, 2);
        losses[placement].push_back(model.forward(x, y).item<double>());
        if (placement == kInBackward) EXPECT_EQ(model.state().nvme_offload()->stats.read_ahead, 3) << "deepened to the most";
      }
      for (int placement : {kInBackward, kAfterBackward}) {
        for (size_t i = 0; i < losses[0].size(); ++i) {
          EXPECT_EQ(losses[placement][i], losses[kMemory][i])
              << fsdp::enum_name(strategy) << (clip > 0 ? " clipped" : "") << (scaling ? ", loss scaled" : "")
              << ", placement " << placement
              << ": step " << i;
        }
      }
    }
  }
  world_group->barrier()->wait();
  if (r == 0) std::filesystem::remove_all(dir);
}
