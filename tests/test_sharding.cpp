// Sharding at W = 2, 3 and 4 against a single process with the global
// batch: FULL_SHARD's training; every strategy's first-step gradients
// (reduce-scatter and the replicas' all-reduce averaged, the padding's
// gradient zero) and training; the communication of the strategy table to
// the byte; tied weights; units below a layer; the strategies' names.
// Besides the tiny preset (whose units pad only at W = 3), a model whose
// units pad at every W (uneven()), so that padding is in every comparison;
// and for the gradients and the training, the Llama with every switch of
// the hub's families at once (every_switch_llama(): tied head, biases, q/k
// norms, explicit head_dim, llama3 rope scaling, sliding window), trained
// also per sublayer, recomputed, initialized sharded and offloaded.

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "plan/estimates.h"
#include "fsdp/token_data.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "core/strategy_rules.h"
#include "core/unit_plan.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::models::ModelConfig;
using fsdp::ShardingStrategy;
using fsdp::testing::world_group;
using fsdp::testing::batch;
using fsdp::testing::block_units;
using fsdp::testing::data_for;
using fsdp::testing::every_switch_llama;
using fsdp::testing::expect_gradients_match;
using fsdp::testing::full_values;
using fsdp::testing::gather_flat;
using fsdp::testing::gpt_unit_numels;
using fsdp::testing::kAllStrategies;
using fsdp::testing::make_gpt;
using fsdp::testing::make_model;
using fsdp::testing::name_of;
using fsdp::testing::options_for;
using fsdp::testing::padded_sum;
using fsdp::testing::ranks_per_node;
using fsdp::testing::shard_size;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::uneven;

// The project's first correctness test: W ranks with batch B train the same
// model as 1 process with batch W*B. Tolerance: relative 1e-5 on each step's
// loss. Both runs compute the same sums in a different order (per-rank
// means averaged vs one mean over W*B rows), so they differ by float32
// rounding: ~1e-7 relative per step (measured: at most 2.3e-7 over 12 steps
// at W = 2 and 4). A real error (a sum instead of a mean, a wrong data
// slice, a gradient lost at a unit boundary) moves the loss by 1e-3 or more
// within two steps.
TEST(Sharding, FullShardTrainsTheSameModelAsOneProcessWithTheGlobalBatch) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  const int64_t B = 2, steps = 12;
  fsdp::models::TokenData data(fsdp::testing::make_token_file("equivalence", 20000, config.vocab), config.context,
                               config.vocab);

  auto sharded = fsdp::fully_shard(make_gpt(config), world_group, block_units());
  torch::optim::AdamW sharded_opt(sharded.parameters(), spec_adamw());
  GPT reference = make_gpt(config);  // every rank runs the single-process reference itself
  torch::optim::AdamW reference_opt(fsdp::testing::unique_parameters(*reference), spec_adamw());

  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = data.batch(step, 0, r, W, 1, B);
    torch::Tensor loss = sharded.forward(x, y);
    sharded_opt.zero_grad();
    loss.backward();
    sharded_opt.step();
    torch::Tensor global_loss = loss.detach().clone();
    world_group->all_reduce(global_loss, fsdp::ReduceOp::kAvg)->wait();

    auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);
    torch::Tensor reference_loss = reference->forward(gx, gy);
    reference_opt.zero_grad();
    reference_loss.backward();
    if (step == 0) {
      // The gradients themselves (Adam's update is scale-invariant, so the
      // losses alone would not catch a sum where a mean belongs).
      expect_gradients_match(sharded.state(), *reference, 1e-4);
    }
    reference_opt.step();

    const double a = global_loss.item<double>(), b = reference_loss.item<double>();
    EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << "step " << step;
  }
  // And the weights, unit by unit, to an absolute 1e-4: a tenth of one
  // step's largest update (lr). Not relative: Adam turns the float noise of
  // gradients that are exactly zero in theory (the key bias of attention)
  // into lr-sized steps of random sign, so tiny weights can differ by ~1e-5.
  for (const auto& unit : fsdp::detail::units(sharded.state())) {
    const auto& flat = unit->flat_param();
    torch::Tensor full = gather_flat(flat, flat.shard());
    for (const auto& e : flat.entries()) {
      torch::Tensor expected = reference->named_parameters()[e.name].detach();
      EXPECT_LT((full.narrow(0, e.offset, e.numel).view(e.shape) - expected).abs().max().item<double>(), 1e-4)
          << e.name;
    }
  }
}

// The first step's gradients, gathered over each unit's shard group, equal
// a single process's with the global batch, and the padding's are zero:
// every strategy, on the tiny preset, on a model whose units pad at
// every W and on the Llama of every switch, and hybrid with every node size that divides W (from nodes of
// one rank, where the replicas' all-reduce does all the averaging, to one
// node of the whole world). The training below compares losses and
// weights, which cannot show a gradient that is uniformly wrong: Adam's
// update is scale-invariant, so a sum where a mean belongs trains nearly
// alike. Tolerance as FullShard's gradient check, relative 1e-4 per tensor
// (float rounding is ~1e-6); a sum instead of a mean is off by a factor 2+.
TEST(Sharding, FirstStepGradientsEqualOneProcessWithTheGlobalBatch) {
  const int W = world_group->size(), r = world_group->rank();
  const int64_t B = 2;
  for (const ModelConfig& config : {ModelConfig(tiny()), ModelConfig(uneven()), ModelConfig(every_switch_llama())}) {
    auto data = data_for(config);
    auto [x, y] = data.batch(0, 0, r, W, 1, B);
    auto [gx, gy] = data.batch(0, 0, 0, 1, 1, W * B);
    std::shared_ptr<fsdp::models::LanguageModel> reference = make_model(config);
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
        auto options = options_for(strategy, torch::kFloat, per_node).wrap_policy(config.wrap_policy(false));
        auto sharded = fsdp::fully_shard(make_model(config), world_group, options);
        sharded.forward(x, y).backward();
        fsdp::testing::expect_gradients_match(sharded.state(), *reference, 1e-4, context);
      }
    }
  }
}

namespace {

// One way of sharding a model in Sharding.EveryStrategyTrainsTheSameModelAsOneProcess.
struct ShardingCase {
  std::string name;
  fsdp::FullyShardOptions options;
  bool sharded_init = false;
};

// Every strategy with a unit per block (decoder layer); for the Llama of
// every switch also the other ways a run shards a model: units per
// attention and per MLP, recomputed activations, sharded initialization and
// CPU offload. (The GPT's are proved by their own tests:
// SublayerUnitsGiveTheGradientsOfOneProcess, ActivationCheckpointing.*,
// StateDict.ShardedInitializationGivesTheShardsOfTheWholeModel, CpuOffload.*.)
std::vector<ShardingCase> sharding_cases(const ModelConfig& config) {
  auto units = [&](ShardingStrategy strategy, bool per_sublayer = false) {
    return options_for(strategy).wrap_policy(config.wrap_policy(per_sublayer));
  };
  std::vector<ShardingCase> cases;
  for (ShardingStrategy strategy : kAllStrategies) cases.push_back({name_of(strategy), units(strategy)});
  if (config.kind() == fsdp::models::ModelKind::kLlama) {
    const ShardingStrategy full = ShardingStrategy::kFullShard;
    cases.push_back({"sublayer units", units(full, true)});
    cases.push_back({"activation checkpointing", units(full).activation_checkpointing(true)});
    cases.push_back({"sublayer units, activation checkpointing", units(full, true).activation_checkpointing(true)});
    cases.push_back({"sharded initialization", units(full), /*sharded_init=*/true});
    cases.push_back({"cpu offload", units(full).offload(fsdp::OffloadPolicy::cpu())});
  }
  return cases;
}

std::set<std::string> unique_parameter_names(const torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& p : fsdp::unique_named_parameters(module)) names.insert(p.first);
  return names;
}

}  // namespace

// Tolerances as in Sharding.FullShardTrainsTheSameModelAsOneProcessWithTheGlobalBatch:
// relative 1e-5 per loss, absolute 1e-4 on the final weights. On models
// whose units pad at every W (uneven() and every_switch_llama()): the
// optimizer steps padded shards, whose padding must stay zero. The Llama
// with every hub family's switch trains the same way under every case of
// sharding_cases(), and its tied head stays the embedding's tensor: one
// parameter of the sharded module (by identity) and one entry of its flat
// parameters. A head given its own copy would fail both, and train apart
// from the single process's tied one.
TEST(Sharding, EveryStrategyTrainsTheSameModelAsOneProcess) {
  const int W = world_group->size(), r = world_group->rank();
  const int64_t B = 2, steps = 10;
  for (const ModelConfig& config : {ModelConfig(uneven()), ModelConfig(every_switch_llama())}) {
    auto data = data_for(config);
    // The single process with the global batch, trained once: its losses, then its weights.
    std::shared_ptr<fsdp::models::LanguageModel> reference = make_model(config);
    torch::optim::AdamW reference_opt(fsdp::testing::unique_parameters(*reference), spec_adamw());
    std::vector<double> reference_losses;
    for (int64_t step = 0; step < steps; ++step) {
      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      reference_losses.push_back(reference_loss.item<double>());
    }
    for (const ShardingCase& c : sharding_cases(config)) {
      SCOPED_TRACE(name_of(config) + ", " + c.name);
      auto sharded = fsdp::testing::shard_model(config, c.options, c.sharded_init);
      torch::optim::AdamW sharded_opt(sharded.parameters(), spec_adamw());
      for (int64_t step = 0; step < steps; ++step) {
        auto [x, y] = data.batch(step, 0, r, W, 1, B);
        torch::Tensor loss = sharded.forward(x, y);
        loss.backward();
        sharded_opt.step();
        sharded_opt.zero_grad();
        sharded.state().check_idle();
        world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();
        EXPECT_NEAR(loss.item<double>(), reference_losses[step], 1e-5 * reference_losses[step]) << "step " << step;
      }
      const auto values = full_values(sharded.state());
      std::set<std::string> flat_names;
      for (const auto& [name, value] : values) {
        flat_names.insert(name);
        EXPECT_LT((value - reference->named_parameters()[name].detach()).abs().max().item<double>(), 1e-4) << name;
      }
      EXPECT_EQ(flat_names, unique_parameter_names(*reference));
      EXPECT_EQ(unique_parameter_names(sharded.module()), unique_parameter_names(*reference));
    }
  }
}

// The bytes each collective kind moves in one (steady-state) step, counted
// by the communicator, against the strategy table. All fp32 here but the
// last case, where bf16 params halve the gathers and the reduction.
TEST(Sharding, CommunicationPerStepMatchesTheStrategyTable) {
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

// The GPT's lm head is the token embedding: its gradient must be the sum of
// the embedding's and the head's, the same as one process computes.
TEST(Sharding, TiedWeightsReceiveTheSumOfBothUsesGradients) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("tied", 5000, config.vocab), config.context,
                               config.vocab);
  auto sharded = fsdp::fully_shard(make_gpt(config), world_group, block_units());
  auto [x, y] = data.batch(0, 0, r, W, 1, 2);
  sharded.forward(x, y).backward();
  const auto& root = fsdp::detail::units(sharded.state()).front()->flat_param();
  ASSERT_EQ(root.entries().front().name, "transformer.wte.weight");
  torch::Tensor grad = gather_flat(root, root.shard().grad());
  const auto& wte_entry = root.entries().front();
  torch::Tensor sharded_grad = grad.narrow(0, wte_entry.offset, wte_entry.numel).view(wte_entry.shape);

  // One process, the whole batch: tied, and untied with the same values.
  auto [gx, gy] = data.batch(0, 0, 0, 1, 1, W * 2);
  GPT reference = make_gpt(config);
  reference->forward(gx, gy).backward();
  torch::Tensor tied_grad = reference->transformer->wte->weight.grad();

  GPT untied = make_gpt(config);
  untied->lm_head->weight = untied->lm_head->weight.detach().clone().requires_grad_(true);
  {
    // Rebind the head to its own copy so that the two uses get separate gradients.
    torch::Tensor x_embed = untied->transformer->wte(gx) +
                            untied->transformer->wpe(torch::arange(config.context, torch::kLong));
    for (const auto& block : *untied->transformer->h) x_embed = block->as<fsdp::models::BlockImpl>()->forward(x_embed);
    torch::Tensor logits = torch::nn::functional::linear(untied->transformer->ln_f(x_embed), untied->lm_head->weight);
    torch::nn::functional::cross_entropy(logits.view({-1, config.vocab}), gy.reshape({-1})).backward();
  }
  torch::Tensor embedding_use = untied->transformer->wte->weight.grad();
  torch::Tensor head_use = untied->lm_head->weight.grad();
  ASSERT_GT(embedding_use.abs().max().item<double>(), 0.0);
  ASSERT_GT(head_use.abs().max().item<double>(), 0.0);
  EXPECT_LT(fsdp::testing::max_relative_difference(tied_grad, embedding_use + head_use), 1e-5);
  EXPECT_LT(fsdp::testing::max_relative_difference(sharded_grad, tied_grad), 1e-4);
}

TEST(Sharding, APolicyThatSplitsTiedWeightsIsRefused) {
  for (auto policy : {fsdp::module_type_policy<torch::nn::EmbeddingImpl>(), fsdp::min_params_policy(1)}) {
    GPT model = make_gpt(tiny());
    try {
      fsdp::fully_shard(model, world_group, fsdp::FullyShardOptions().wrap_policy(policy));
      ADD_FAILURE() << "a policy that splits the tied embedding was accepted";
    } catch (const c10::Error& e) {
      std::string msg = fsdp::error_message(e);
      EXPECT_NE(msg.find("splits a tied parameter"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'transformer.wte.weight'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'lm_head.weight'"), std::string::npos) << msg;
    }
    // Nothing was sharded: the model is intact and can be sharded properly.
    EXPECT_GT(model->transformer->wte->weight.numel(), 0);
    EXPECT_NO_THROW(fsdp::fully_shard(model, world_group, block_units()));
  }
}

// Units per attention and per MLP (the trainer's --wrap sublayer), with and
// without activation checkpointing: the first step's gradients are the
// single-process ones, and the largest gathered buffer is an MLP's, not a
// block's.
TEST(Sharding, SublayerUnitsGiveTheGradientsOfOneProcess) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("sublayer", 5000, config.vocab), config.context,
                               config.vocab);
  auto [gx, gy] = data.batch(0, 0, 0, 1, 1, W * 2);
  GPT reference = make_gpt(config);
  reference->forward(gx, gy).backward();
  for (bool checkpointing : {false, true}) {
    using namespace fsdp::models;
    auto sharded = fsdp::fully_shard(make_gpt(config), world_group,
                                     fsdp::FullyShardOptions()
                                         .wrap_policy(fsdp::module_type_policy<AttentionImpl, MLPImpl>())
                                         .activation_checkpointing(checkpointing));
    ASSERT_EQ(fsdp::detail::units(sharded.state()).size(), static_cast<size_t>(1 + 2 * config.layers));
    auto [x, y] = data.batch(0, 0, r, W, 1, 2);
    sharded.forward(x, y).backward();
    expect_gradients_match(sharded.state(), *reference, 1e-4,
                           checkpointing ? " with activation checkpointing" : " without activation checkpointing");
    sharded.state().check_idle();
  }
}

TEST(Sharding, EnumNamesRoundTripAliasesParseAndUnknownNamesAreRefused) {
  for (auto s : kAllStrategies) EXPECT_EQ(fsdp::parse_enum<fsdp::ShardingStrategy>(fsdp::enum_name(s)), s);
  try {
    fsdp::parse_enum<fsdp::ShardingStrategy>("zero4");
    ADD_FAILURE();
  } catch (const c10::Error& e) {
    EXPECT_NE(fsdp::error_message(e).find("unknown sharding strategy 'zero4': expected one of no_shard, zero1"),
              std::string::npos);
  }
  // An alias parses to its value and is not listed; a value with no name is named as LibTorch names it.
  EXPECT_EQ(fsdp::parse_enum<torch::ScalarType>("bfloat16"), torch::kBFloat16);
  EXPECT_EQ(std::string(fsdp::enum_name(torch::kBFloat16)), "bf16");
  EXPECT_EQ(std::string(fsdp::enum_name(torch::kDouble)), c10::toString(torch::kDouble));
  try {
    fsdp::parse_enum<torch::ScalarType>("fp8");
    ADD_FAILURE();
  } catch (const c10::Error& e) {
    EXPECT_NE(fsdp::error_message(e).find("unknown dtype 'fp8': expected one of fp32, bf16, fp16"), std::string::npos)
        << fsdp::error_message(e);
  }
}
