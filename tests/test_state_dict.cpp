// State dicts at W = 2, 3 and 4: the full state dict is the model, loads
// into a sharded model, sharded round trips, sharded initialization giving
// the shards of the whole model, and UnshardScope (whole parameters for
// evaluation, written back), Hugging Face folders read into the shards and
// streamed out of them.

#include <gtest/gtest.h>

#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/hugging_face.h"
#include "fsdp/llama.h"
#include "fsdp/model_config.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "state_dict/hugging_face_files.h"
#include "base/memory_counters.h"
#include "core/strategy_rules.h"
#include "core/unit_plan.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::testing::world_group;
using fsdp::testing::batch;
using fsdp::testing::block_units;
using fsdp::testing::expect_same_params;
using fsdp::testing::full_params;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::token_data;

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
    expect_same_params(target.state(), source.state(), fsdp::enum_name(strategy));
    // And the loaded model computes with the loaded values (the gathered
    // copies were refreshed).
    auto [x, y] = batch(token_data(), 0, 0, 1, 2);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(target(x, y), source(x, y))) << fsdp::enum_name(strategy);
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

// Each rank reads only its shards' elements of a Hugging Face folder (BF16,
// in several files; GPT-2's Conv1D weights, stored transposed, whole), and
// the gathered units stream back out into a folder (save_full_weights into a
// FolderWriter, rank 0) that reads back to the same values. The GPT's head is
// tied, and so is the Llama's, whose projections are also fused (Phi-3's).
TEST(StateDict, HuggingFaceFoldersIntoTheShardsAndOut) {
  namespace hf = fsdp::hugging_face;
  fsdp::models::LlamaConfig llama;
  llama.tie_word_embeddings = llama.fused_projections = true;
  llama.hub_family = "phi3";
  for (const fsdp::models::ModelConfig& config : {fsdp::models::ModelConfig(tiny()), fsdp::models::ModelConfig(llama)}) {
    const std::string kind = fsdp::enum_name(config.kind());
    const std::string dir = "/tmp/fsdp_test_hf_" + kind + "_w" + std::to_string(world_group->size());
    hf::HubConfig hub;
    hub.model = config;
    const auto reference = config.new_model();
    reference->init_weights(7);
    std::vector<fsdp::safetensors::TensorSpec> specs;
    for (const auto& [name, param] : fsdp::unique_named_parameters(*reference)) {
      specs.push_back({name, torch::kFloat, param.sizes().vec()});
    }
    // Each rank writes the same folder of its own (no rank waits for another's files).
    const std::string in = dir + "_in" + std::to_string(world_group->rank());
    {
      hf::FolderWriter writer(in, hub, specs, hf::SaveOptions().dtype(torch::kBFloat16).max_shard_bytes(16 * 1024));
      for (const auto& [name, param] : fsdp::unique_named_parameters(*reference)) writer.write(param);
      writer.commit();
    }
    const hf::ModelFiles files = hf::find_model(in);
    EXPECT_GT(files.weights.size(), 2u) << kind << ": shards of 16 KB";
    EXPECT_EQ(hf::stored_dtype(files), torch::kBFloat16) << kind;

    const auto fresh = config.new_model();
    fresh->init_weights(8);
    auto model = fsdp::fully_shard(fresh, world_group, fsdp::FullyShardOptions().wrap_policy(config.wrap_policy(false)));
    hf::load_weights(model.state(), files, config);
    const fsdp::StateDict loaded = fsdp::full_state_dict(model.state());
    ASSERT_EQ(loaded.size(), specs.size()) << kind;
    for (const auto& [name, param] : fsdp::unique_named_parameters(*reference)) {
      EXPECT_TRUE(torch::equal(loaded[name], param.to(torch::kBFloat16).to(torch::kFloat))) << kind << " " << name;
    }

    const std::string out = dir + "_out";
    fsdp::save_full_weights(model.state(), [&](std::vector<fsdp::safetensors::TensorSpec> gathered) {
      return std::make_unique<hf::FolderWriter>(out, hub, gathered);
    });
    if (world_group->rank() != 0) continue;
    const auto back = config.new_model();
    hf::load_weights(*back, hf::find_model(out), config);
    for (const auto& [name, param] : fsdp::unique_named_parameters(*back)) {
      EXPECT_TRUE(torch::equal(param, loaded[name])) << kind << " " << name << " out and back";
    }
    EXPECT_EQ(hf::find_model(out).weights.size(), 1u) << "within 5 GB: one model.safetensors";
  }
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

// A model built under DeferredInit has shapes but no memory of its own;
// fully_shard refuses it without an init function, and with one gives
// exactly the shards of a model initialized whole.
TEST(StateDict, ShardedInitializationGivesTheShardsOfTheWholeModel) {
  GPTConfig config = tiny();
  auto whole = fsdp::fully_shard(fsdp::testing::make_gpt(config, 5), world_group, block_units());
  fsdp::models::GPT deferred(nullptr);
  {
    fsdp::memory::DeferredInit scope;
    deferred = fsdp::models::GPT(config);
  }
  EXPECT_TRUE(fsdp::memory::is_deferred(deferred->transformer->wte->weight.data_ptr()));
  try {
    fsdp::fully_shard(deferred, world_group, block_units());
    ADD_FAILURE() << "a deferred model was sharded without an init function";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("was created under memory::DeferredInit and has no values"), std::string::npos)
        << e.what();
  }
  torch::manual_seed(5);
  auto sharded = fsdp::fully_shard(
      deferred, world_group,
      block_units().param_init_fn([deferred](const std::string& name, torch::Tensor& p) { deferred->init_parameter(name, p); }));
  ASSERT_EQ(sharded.parameters().size(), whole.parameters().size());
  for (size_t u = 0; u < whole.parameters().size(); ++u) {
    EXPECT_TRUE(torch::equal(sharded.parameters()[u], whole.parameters()[u])) << "unit " << u;
  }
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
