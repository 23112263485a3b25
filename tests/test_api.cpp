// The API a user's own loop calls, on 2, 3 and 4 ranks: TrainStep against the
// hand-written step, in-memory full and sharded state dicts, UnshardScope,
// and checkpoints of every optimizer the library can shard.

#include <gtest/gtest.h>

#include <filesystem>

#include "fsdp/checkpoint.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/optimizer_state.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "test_helpers.h"

using fsdp::models::GPT;
using fsdp::models::GPTConfig;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;
using fsdp::testing::world_group;

namespace {

using fsdp::testing::block_units;
using fsdp::testing::tiny;

// The batch of micro-step `micro` of step `step` in the spec's order.
std::pair<torch::Tensor, torch::Tensor> batch(const fsdp::models::TokenData& data, int64_t step, int64_t micro,
                                              int64_t micro_steps, int64_t batch_size) {
  return data.batch(step, micro, world_group->rank(), world_group->size(), micro_steps, batch_size);
}

const fsdp::models::TokenData& token_data() {
  static fsdp::models::TokenData data(fsdp::testing::make_token_file("api", 20000, 256), tiny().context, 256);
  return data;
}

// Every parameter's full value, by name.
std::map<std::string, torch::Tensor> full_params(fsdp::FsdpState& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : fsdp::full_state_dict(state)) out[item.key()] = item.value();
  return out;
}

void expect_same_params(fsdp::FsdpState& a, fsdp::FsdpState& b, const std::string& context) {
  auto pa = full_params(a), pb = full_params(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, value] : pa) EXPECT_TRUE(torch::equal(value, pb.at(name))) << name << " differs " << context;
}

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

TEST(StateDict, FullStateDictIsTheModel) {
  GPT reference = make_gpt(tiny(), 3);
  auto model = fsdp::fully_shard(make_gpt(tiny(), 3), world_group, block_units());
  const fsdp::StateDict full = fsdp::full_state_dict(model.state());
  const auto expected = fsdp::unique_named_parameters(*reference);
  ASSERT_EQ(full.size(), expected.size());
  size_t i = 0;
  for (const auto& item : full) {
    EXPECT_EQ(item.key(), expected[i].first) << "the model's own order and names";
    EXPECT_TRUE(torch::equal(item.value(), expected[i].second)) << item.key();
    ++i;
  }
  const fsdp::StateDict rank0 = fsdp::full_state_dict(model.state(), fsdp::FullStateDictOptions().rank0_only(true));
  EXPECT_EQ(rank0.size(), world_group->rank() == 0 ? expected.size() : 0u);
}

TEST(StateDict, LoadFullIntoAShardedModel) {
  for (auto strategy : {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kNoShard,
                        fsdp::ShardingStrategy::kZero1}) {
    auto source = fsdp::fully_shard(make_gpt(tiny(), 5), world_group, block_units());
    auto target = fsdp::fully_shard(make_gpt(tiny(), 6), world_group, block_units(strategy));
    fsdp::load_full_state_dict(target.state(), fsdp::full_state_dict(source.state()));
    expect_same_params(target.state(), source.state(), fsdp::strategy_name(strategy));
    // And the loaded model computes with the loaded values (the gathered
    // copies were refreshed).
    auto [x, y] = batch(token_data(), 0, 0, 1, 2);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(target(x, y), source(x, y))) << fsdp::strategy_name(strategy);
  }
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  fsdp::StateDict dict = fsdp::full_state_dict(model.state());
  fsdp::StateDict missing;
  for (const auto& item : dict)
    if (item.key() != "transformer.ln_f.bias") missing.insert(item.key(), item.value());
  EXPECT_THROW(fsdp::load_full_state_dict(model.state(), missing), c10::Error);
  dict.insert("extra.weight", torch::zeros({2}));
  EXPECT_THROW(fsdp::load_full_state_dict(model.state(), dict), c10::Error);
}

TEST(StateDict, ShardedRoundTrip) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW optimizer(model.parameters(), spec_adamw());
  const auto before = full_params(model.state());
  const fsdp::ShardedStateDict mine = fsdp::sharded_state_dict(model.state());
  int64_t held = 0;
  for (const auto& item : mine) held += item.value().local.numel();
  torch::Tensor total = torch::tensor({held}, torch::kLong);
  world_group->all_reduce(total, fsdp::ReduceOp::kSum)->wait();
  int64_t numel = 0;
  for (const auto& [name, value] : before) numel += value.numel();
  EXPECT_EQ(total.item<int64_t>(), numel) << "the pieces partition the model";
  fsdp::TrainStep step(model, optimizer);
  step([&](int64_t micro) {
    auto [x, y] = batch(token_data(), 0, micro, 1, 2);
    return model(x, y);
  });
  fsdp::load_sharded_state_dict(model.state(), mine);
  const auto after = full_params(model.state());
  for (const auto& [name, value] : before) EXPECT_TRUE(torch::equal(after.at(name), value)) << name;
  // Pieces of another layout are refused.
  auto other = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units(fsdp::ShardingStrategy::kNoShard));
  EXPECT_THROW(fsdp::load_sharded_state_dict(other.state(), mine), c10::Error);
}

TEST(UnshardScope, WholeParametersForEvaluation) {
  for (auto strategy : {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp,
                        fsdp::ShardingStrategy::kNoShard}) {
    auto model = fsdp::fully_shard(make_gpt(tiny(), 9), world_group, block_units(strategy));
    const auto expected = full_params(model.state());
    auto [x, y] = batch(token_data(), 0, 0, 1, 2);
    torch::Tensor through_units;
    {
      torch::NoGradGuard no_grad;
      through_units = model(x, y);
    }
    {
      fsdp::UnshardScope whole(model.state());
      for (const auto& [name, param] : fsdp::unique_named_parameters(model.module())) {
        EXPECT_TRUE(torch::equal(param, expected.at(name))) << name << " inside the scope";
      }
      torch::NoGradGuard no_grad;
      // The model's modules called directly, not through the root unit.
      torch::Tensor logits = model->logits(x);
      EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, tiny().context, tiny().vocab}));
      EXPECT_TRUE(torch::equal(model(x, y), through_units)) << "a forward inside the scope";
      for (const auto& [name, param] : fsdp::unique_named_parameters(model.module())) {
        EXPECT_EQ(param.sizes(), expected.at(name).sizes()) << name << " after a forward inside the scope";
      }
      // A backward inside the scope is refused.
      torch::AutoGradMode grad(true);
      EXPECT_THROW(model(x, y).backward(), c10::Error);
    }
    model.state().check_idle();
    if (!fsdp::keeps_params_unsharded(strategy)) {
      EXPECT_EQ(model->transformer->wte->weight.numel(), 0) << "resharded after the scope";
    }
    torch::optim::AdamW optimizer(model.parameters(), spec_adamw());
    fsdp::TrainStep step(model, optimizer);
    EXPECT_NO_THROW(step([&](int64_t) { return model(x, y); })) << "training after the scope";
  }
}

TEST(UnshardScope, Writeback) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  {
    fsdp::UnshardScope whole(model.state(), /*writeback=*/true);
    torch::NoGradGuard no_grad;
    model->transformer->ln_f->weight.fill_(2.5);
    model->transformer->h[1]->as<fsdp::models::BlockImpl>()->mlp->c_fc->bias.fill_(-1.0);
  }
  const auto after = full_params(model.state());
  EXPECT_TRUE(torch::equal(after.at("transformer.ln_f.weight"), torch::full({tiny().width}, 2.5)));
  EXPECT_TRUE(torch::equal(after.at("transformer.h.1.mlp.c_fc.bias"), torch::full({4 * tiny().width}, -1.0)));
  {
    fsdp::UnshardScope whole(model.state());  // without writeback: discarded
    torch::NoGradGuard no_grad;
    model->transformer->ln_f->weight.fill_(7.0);
  }
  EXPECT_TRUE(torch::equal(full_params(model.state()).at("transformer.ln_f.weight"), torch::full({tiny().width}, 2.5)));
  auto bf16 = fsdp::fully_shard(make_gpt(tiny()), world_group,
                                block_units().mixed_precision(fsdp::MixedPrecision().param_dtype(torch::kBFloat16)));
  EXPECT_THROW({ fsdp::UnshardScope refused(bf16.state(), true); }, c10::Error);
}

// Checkpoints keep every shardable optimizer's state: stopped after 2 steps,
// saved, reloaded into a fresh model and optimizer, and continued, the
// model equals one trained straight through, bit for bit.
template <class Optimizer, class Options>
void expect_exact_resume(const Options& options, const std::string& name, fsdp::CheckpointFormat format) {
  const std::string dir = "/tmp/fsdp_api_ckpt_" + name + "_" + std::to_string(world_group->size());
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  auto train = [&](auto& model, auto& train_step, int64_t from, int64_t to) {
    for (int64_t step = from; step < to; ++step) {
      train_step([&](int64_t micro) {
        auto [x, y] = batch(token_data(), step, micro, 1, 2);
        return model(x, y);
      });
    }
  };
  auto straight = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  Optimizer opt_straight(straight.parameters(), options);
  fsdp::TrainStep step_straight(straight, opt_straight);
  train(straight, step_straight, 0, 4);

  std::string path;
  {
    auto first = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
    Optimizer opt_first(first.parameters(), options);
    fsdp::TrainStep step_first(first, opt_first);
    train(first, step_first, 0, 2);
    path = fsdp::save_checkpoint(first.state(), opt_first, dir, 2, {}, format);
  }
  auto resumed = fsdp::fully_shard(make_gpt(tiny(), 99), world_group, block_units());
  Optimizer opt_resumed(resumed.parameters(), options);
  const fsdp::CheckpointInfo info = fsdp::load_checkpoint(resumed.state(), opt_resumed, path);
  EXPECT_EQ(info.optimizer_type, fsdp::OptimizerState(opt_resumed).type());
  EXPECT_EQ(info.step, 2);
  fsdp::TrainStep step_resumed(resumed, opt_resumed);
  train(resumed, step_resumed, 2, 4);
  expect_same_params(resumed.state(), straight.state(), name + " " + fsdp::checkpoint_format_name(format));
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Checkpoint, EveryShardableOptimizerResumesExactly) {
  for (auto format : {fsdp::CheckpointFormat::kSharded, fsdp::CheckpointFormat::kFull}) {
    expect_exact_resume<torch::optim::AdamW>(spec_adamw(), "adamw", format);
    expect_exact_resume<torch::optim::Adam>(torch::optim::AdamOptions(1e-3).amsgrad(true), "adam_amsgrad", format);
    expect_exact_resume<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1), "sgd_momentum",
                                           format);
    expect_exact_resume<torch::optim::SGD>(torch::optim::SGDOptions(0.05), "sgd", format);
  }
}

TEST(Checkpoint, RefusesAnotherOptimizersState) {
  const std::string dir = "/tmp/fsdp_api_ckpt_mismatch_" + std::to_string(world_group->size());
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW adamw(model.parameters(), spec_adamw());
  const std::string path = fsdp::save_checkpoint(model.state(), adamw, dir, 1);
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    fsdp::load_checkpoint(model.state(), sgd, path);
    ADD_FAILURE() << "an AdamW checkpoint loaded into SGD";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds the state of optimizer 'adamw'"), std::string::npos) << e.what();
  }
  torch::optim::LBFGS lbfgs(model.parameters(), torch::optim::LBFGSOptions(1.0));
  EXPECT_THROW(fsdp::save_checkpoint(model.state(), lbfgs, dir, 2), c10::Error);
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
