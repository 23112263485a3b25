#pragma once
// Shared by the multi-rank feature tests (mpi_tests, test_devices): options
// for every sharding strategy, a sharded GPT beside the single-process
// reference it must track, a unit's or a model's full values gathered from
// the shards, the token data of the API tests, and a short training run's
// losses. Every helper that gathers is collective: every rank of the world
// must call it.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "plan/estimates.h"
#include "fsdp/model_config.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "mpi_test_env.h"
#include "test_helpers.h"

namespace fsdp::testing {

// ---- every sharding strategy (from the strategy tests) ----

inline const std::vector<ShardingStrategy> kAllStrategies = {
    ShardingStrategy::kNoShard,     ShardingStrategy::kZero1,        ShardingStrategy::kShardGradOp,
    ShardingStrategy::kFullShard,   ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2};

// Hybrid strategies' node: 2 ranks where 2 divides the world (W = 2 is one
// node, W = 4 two, replicated), else the whole world as one node: at W = 3
// that shards over 3 ranks, where every unit pads, rather than over nodes of
// one rank that shard nothing. The replicas' all-reduce at W = 2 and 3 is
// covered by the gradient test, which tries every node size.
inline int ranks_per_node() { return world_group->size() % 2 == 0 ? 2 : world_group->size(); }

inline FullyShardOptions options_for(ShardingStrategy strategy, torch::ScalarType param_dtype = torch::kFloat,
                                     int per_node = ranks_per_node()) {
  return FullyShardOptions()
      .wrap_policy(module_type_policy<models::BlockImpl>())
      .strategy(strategy)
      .ranks_per_node(per_node)
      .mixed_precision(MixedPrecision().param_dtype(param_dtype));
}

inline int64_t padded_sum(const models::GPTConfig& config, int64_t K) {
  int64_t total = 0;
  for (int64_t n : gpt_unit_numels(config)) total += (n + K - 1) / K * K;
  return total;
}

inline int shard_size(ShardingStrategy s) { return shard_group_size(s, world_group->size(), ranks_per_node()); }

// The full fp32 values of every parameter, gathered unit by unit
// (collective); the padding must have stayed zero through the steps.
inline std::map<std::string, torch::Tensor> full_values(FsdpState& state) {
  std::map<std::string, torch::Tensor> values;
  for (const auto& unit : fsdp::detail::units(state)) {
    const auto& flat = unit->flat_param();
    torch::Tensor full = flat.gather_full(flat.shard());
    EXPECT_TRUE(padding_of(flat, full).eq(0).all().item<bool>())
        << "unit " << unit->display_name() << "'s padding is not zero";
    for (const auto& e : flat.entries()) values[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape);
  }
  return values;
}

inline models::TokenData data_for(const models::ModelConfig& config) {
  const TransformerShape c = config.shape();
  return models::TokenData(make_token_file("strategies", 20000, c.vocab), c.context, c.vocab);
}

inline std::string name_of(ShardingStrategy s) { return fsdp::enum_name(s); }
inline std::string name_of(const models::GPTConfig& c) { return c.width == tiny().width ? "tiny" : "uneven"; }
inline std::string name_of(const models::ModelConfig& c) {
  return c.kind() == models::ModelKind::kGpt ? name_of(c.gpt()) : "every-switch llama";
}

// The model of `config` sharded with `options`: initialized whole from
// `seed`; or, with `sharded_init`, built without values (memory::DeferredInit)
// and initialized unit by unit inside fully_shard from the same draws, as
// fsdp-train --sharded-init does.
inline FullyShardedModule<models::LanguageModel> shard_model(const models::ModelConfig& config,
                                                             FullyShardOptions options, bool sharded_init = false,
                                                             uint64_t seed = 1) {
  if (!sharded_init) return fully_shard(make_model(config, seed), world_group, std::move(options));
  std::shared_ptr<models::LanguageModel> model;
  {
    memory::DeferredInit deferred;
    model = config.new_model();
  }
  torch::manual_seed(seed);
  const models::LanguageModel* initializer = model.get();  // raw: the model outlives the state keeping the options
  options.param_init_fn(
      [initializer](const std::string& name, torch::Tensor& p) { initializer->init_parameter(name, p); });
  return fully_shard(model, world_group, std::move(options));
}

// A sharded GPT and the single-process reference it must track, built from
// the same seed, each with the spec's AdamW.
struct ShardedAndReference {
  ShardedAndReference(FullyShardOptions options, const models::GPTConfig& config = tiny())
      : sharded(fully_shard(make_gpt(config), world_group, std::move(options))),
        sharded_opt(sharded.parameters(), spec_adamw()),
        reference(make_gpt(config)),
        reference_params(unique_parameters(*reference)),
        reference_opt(reference_params, spec_adamw()) {}

  FullyShardedModule<models::GPTImpl> sharded;
  torch::optim::AdamW sharded_opt;
  models::GPT reference;
  std::vector<torch::Tensor> reference_params;
  torch::optim::AdamW reference_opt;
};

// The full value of a unit's parameters, gathered from the shards.
inline torch::Tensor gather_flat(const FlatParam& flat, const torch::Tensor& shard_tensor) {
  torch::Tensor full = torch::empty({flat.padded_numel()});
  world_group->all_gather(full, shard_tensor.detach().contiguous())->wait();
  return full;
}

// ---- the API tests' data and parameters (TrainStep, state dicts, checkpoints) ----

// The batch of micro-step `micro` of step `step` in the spec's order.
inline std::pair<torch::Tensor, torch::Tensor> batch(const models::TokenData& data, int64_t step, int64_t micro,
                                                     int64_t micro_steps, int64_t batch_size) {
  return data.batch(step, micro, world_group->rank(), world_group->size(), micro_steps, batch_size);
}

inline const models::TokenData& token_data() {
  static models::TokenData data(make_token_file("api", 20000, 256), tiny().context, 256);
  return data;
}

// Every parameter's full value, by name.
inline std::map<std::string, torch::Tensor> full_params(FsdpState& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : full_state_dict(state)) out[item.key()] = item.value();
  return out;
}

inline void expect_same_params(FsdpState& a, FsdpState& b, const std::string& context) {
  auto pa = full_params(a), pb = full_params(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, value] : pa) EXPECT_TRUE(torch::equal(value, pb.at(name))) << name << " differs " << context;
}

// ---- a short training run (offload and device tests) ----

// Trains `steps` steps of the tiny GPT and returns the global losses.
inline std::vector<double> train_losses(FullyShardOptions options, int64_t steps, c10::Device data_device,
                                        const ProcessGroupPtr& group = world_group) {
  const int W = world_group->size(), r = world_group->rank();
  const models::GPTConfig config = tiny();
  models::TokenData data(make_token_file("devices", 20000, config.vocab), config.context, config.vocab);
  auto model = fully_shard(make_gpt(config), group, std::move(options));
  FusedAdamW optimizer(model.parameters(), spec_adamw());
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = data.batch(step, 0, r, W, 1, 2);
    torch::Tensor loss = model.forward(x.to(data_device), y.to(data_device));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    torch::Tensor global = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
    world_group->all_reduce(global, ReduceOp::kAvg)->wait();
    losses.push_back(global.item<double>());
  }
  return losses;
}

}  // namespace fsdp::testing
