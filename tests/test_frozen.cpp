// Frozen parameters (requires_grad false before fully_shard), at W = 1 to 4:
// they never change (weight decay, the optimizer's own or TrainStep's,
// clipping, a step skipped by loss scaling, both AdamWs, bf16 params, CPU
// offload), hold no gradient, optimizer or reduce-scatter bytes, are in the
// full state dicts under their names (sharded init fills them), and a
// model with frozen parameters trains as one process with the same ones
// frozen (every strategy, recompute, hpZ). The frozen set makes every kind of unit: the root mixed (wpe),
// block 0 all frozen, block 1 mixed (its attention's c_attn).

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "base/compat.h"
#include "core/nf4.h"
#include "core/unit.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/lora.h"
#include "fsdp/memory.h"
#include "fsdp/safetensors.h"
#include "fsdp/state_dict.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "core/unit_plan.h"

using fsdp::ShardingStrategy;
using fsdp::memory::Category;
using fsdp::models::GPT;
using fsdp::testing::world_group;

namespace {

const std::regex kFrozen(R"(wpe|h\.0\.|h\.1\.attn\.c_attn\.)");

// The tiny GPT with the parameters kFrozen names frozen.
GPT make_partly_frozen_gpt() {
  GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
  for (auto& [name, param] : fsdp::unique_named_parameters(*model)) {
    if (std::regex_search(name, kFrozen)) param.requires_grad_(false);
  }
  return model;
}

bool is_frozen(const std::string& name) { return std::regex_search(name, kFrozen); }

// The elements of the shards the optimizer gets.
int64_t trainable_shard_numel(const fsdp::FsdpState& state) {
  int64_t n = 0;
  for (const auto& shard : state.parameters()) n += shard.numel();
  return n;
}

// The trainable units' reduced gradients, gathered, against the reference's
// (relative 1e-4, as Sharding's gradient test); the frozen parts have none.
void expect_trainable_gradients_match(const fsdp::FsdpState& state, const torch::nn::Module& reference,
                                      double tolerance = 1e-4) {
  const auto expected = reference.named_parameters();
  for (const auto& unit : fsdp::detail::units(state)) {
    const fsdp::FlatParam& flat = unit->flat_param();
    if (const fsdp::FlatParam* frozen = unit->frozen_params()) {
      EXPECT_FALSE(frozen->shard().grad().defined()) << frozen->name();
    }
    if (flat.entries().empty()) continue;
    ASSERT_TRUE(flat.shard().grad().defined()) << unit->display_name();
    const torch::Tensor full = flat.gather_full(flat.shard().grad());
    for (const auto& e : flat.entries()) {
      EXPECT_LT(fsdp::testing::max_relative_difference(full.narrow(0, e.offset, e.numel).view(e.shape),
                                                       expected[e.name].grad()),
                tolerance)
          << "gradient of " << e.name;
    }
  }
}

}  // namespace

// Frozen parameters stay bit for bit what they were, whatever touches the
// shards between steps, and the trainable ones train; the optimizer holds
// state for the trainable shards only, and the counters see gradient and
// optimizer bytes for them only (the frozen shards are parameter bytes).
TEST(FrozenParameters, NeverChangeAndHoldNoGradientOrOptimizerBytes) {
  const auto& data = fsdp::testing::token_data();
  struct Case {
    const char* name;
    ShardingStrategy strategy;
    bool fused;           // fsdp::FusedAdamW with TrainStep's decay, else torch's AdamW with its own
    bool clip;            // TrainStep clips the global norm
    torch::ScalarType param_dtype;
    bool cpu_offload;
    bool skip_first;  // loss scaling from a scale that overflows: the first step is skipped
  };
  const Case cases[] = {
      {"AdamW's own decay, full_shard", ShardingStrategy::kFullShard, false, false, torch::kFloat, false, false},
      {"FusedAdamW, TrainStep's decay and clipping, full_shard", ShardingStrategy::kFullShard, true, true,
       torch::kFloat, false, false},
      {"AdamW's own decay and clipping, zero1, bf16 params", ShardingStrategy::kZero1, false, true, torch::kBFloat16,
       false, false},
      {"FusedAdamW, TrainStep's decay, cpu_offload", ShardingStrategy::kFullShard, true, false, torch::kFloat, true,
       false},
      {"FusedAdamW, TrainStep's decay and clipping, a skipped step", ShardingStrategy::kFullShard, true, true,
       torch::kFloat, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fsdp::memory::Usage before = fsdp::memory::usage();
    auto model = fsdp::fully_shard(make_partly_frozen_gpt(), world_group,
                                   fsdp::testing::options_for(c.strategy, c.param_dtype).offload(c.cpu_offload ? fsdp::OffloadPolicy::cpu() : fsdp::OffloadPolicy()));
    const auto initial = fsdp::testing::full_params(model.state());
    std::unique_ptr<torch::optim::AdamW> optimizer;
    auto options = fsdp::TrainStepOptions().gather_rank_figures(false).clip_grad_norm(c.clip ? 0.01 : 0.0);
    if (c.skip_first) {
      options.loss_scaling(true).grad_scaler(fsdp::GradScalerOptions().init_scale(1e38).backoff_factor(1e-30));
    }
    if (c.fused) {
      optimizer = std::make_unique<fsdp::FusedAdamW>(model.parameters(), fsdp::testing::spec_adamw());
      options.weight_decay(0.5);
    } else {
      optimizer =
          std::make_unique<torch::optim::AdamW>(model.parameters(), fsdp::testing::spec_adamw().weight_decay(0.5));
    }
    fsdp::TrainStep train_step(model, *optimizer, options);
    fsdp::StepResult last;
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = fsdp::testing::batch(data, step, 0, 1, 2);
      last = train_step([&](int64_t) { return model.forward(x, y); });
      EXPECT_EQ(last.stepped, !(c.skip_first && step == 0)) << "step " << step;
    }
    const auto after = fsdp::testing::full_params(model.state());
    ASSERT_EQ(after.size(), initial.size());  // the frozen ones under their names too
    int frozen = 0;
    for (const auto& [name, value] : after) {
      if (is_frozen(name)) {
        ++frozen;
        EXPECT_TRUE(torch::equal(value, initial.at(name))) << name << " (frozen) changed";
      } else {
        EXPECT_FALSE(torch::equal(value, initial.at(name))) << name << " (trainable) did not train";
      }
    }
    EXPECT_GT(frozen, 0);

    // No frozen shard among the optimizer's, none with a gradient.
    const auto& units = fsdp::detail::units(model.state());
    int64_t frozen_shard_numel = 0;
    for (const auto& unit : units) {
      const fsdp::FlatParam* flat = unit->frozen_params();
      if (!flat) continue;
      frozen_shard_numel += flat->shard_numel();
      EXPECT_FALSE(flat->shard().requires_grad() || flat->shard().grad().defined()) << flat->name();
      for (const auto& e : flat->entries()) EXPECT_TRUE(is_frozen(e.name)) << e.name;
    }
    EXPECT_GT(frozen_shard_numel, 0);
    const int64_t trainable = trainable_shard_numel(model.state());
    int64_t state_numel = 0;
    for (const auto& shard : model.parameters()) {
      auto it = optimizer->state().find(fsdp::compat::optimizer_state_key(*optimizer, shard));
      if (it == optimizer->state().end()) continue;  // a unit with no trainable element
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      EXPECT_EQ(s.exp_avg().numel(), shard.numel());
      state_numel += s.exp_avg().numel() + s.exp_avg_sq().numel();
    }
    EXPECT_EQ(state_numel, 2 * trainable);

    // A step's collectives (full_shard, fp32): every unit gathered in
    // forward and again in backward, frozen parts too; only the trainable
    // parts reduce-scattered.
    if (c.strategy == ShardingStrategy::kFullShard && c.param_dtype == torch::kFloat) {
      int64_t gathered = 0, reduced = 0;
      for (const auto& unit : units) {
        for (const fsdp::FlatParam* flat : unit->buffers()) gathered += flat->padded_numel();
        reduced += unit->flat_param().padded_numel();
      }
      const auto bytes = [&](fsdp::CollectiveKind kind) { return last.comm.bytes[static_cast<size_t>(kind)]; };
      EXPECT_EQ(bytes(fsdp::CollectiveKind::kReduceScatter), 4 * reduced);
      EXPECT_EQ(bytes(fsdp::CollectiveKind::kAllGather), 2 * 4 * gathered);
    }

    // The counters: gradients and moments of the trainable shards only
    // (zero1 keeps each trainable unit's whole gradient; the moments may
    // come with a small step tensor per shard).
    const fsdp::memory::Usage now = fsdp::memory::usage();
    const int64_t f32 = 4;
    int64_t gradient_numel = 0;
    for (const auto& unit : units) {
      const fsdp::FlatParam& flat = unit->flat_param();
      gradient_numel += flat.config().full_gradients ? flat.padded_numel() : flat.shard_numel();
    }
    if (!c.cpu_offload) {  // (offloaded gradients live in pinned host blocks, counted apart)
      EXPECT_EQ(now.live(Category::kGradientShard) - before.live(Category::kGradientShard), gradient_numel * f32)
          << "gradient bytes";
    }
    const int64_t moments = now.live(Category::kOptimizerState) - before.live(Category::kOptimizerState);
    EXPECT_GE(moments, 2 * trainable * f32);
    EXPECT_LT(moments, 2 * trainable * f32 + 64 * static_cast<int64_t>(units.size()));
  }
}

// The same frozen set on one process with the global batch: the same losses
// and weights (tolerances as Sharding's equivalence tests), under AdamW's
// own decay, which PyTorch applies only to the parameters the optimizer
// steps; first-step gradients of the trainable parameters match too. Every
// kind of unit life: resharded after forward or not, persistent parameters,
// replicas, a recomputed forward, a secondary partition.
TEST(FrozenParameters, TrainTheSameModelAsOneProcess) {
  const int W = world_group->size();
  const int64_t B = 2, steps = 5;
  const auto& data = fsdp::testing::token_data();
  using fsdp::testing::options_for;
  std::vector<std::pair<std::string, fsdp::FullyShardOptions>> cases = {
      {"full_shard", options_for(ShardingStrategy::kFullShard)},
      // The frozen part gathered again for the recompute.
      {"full_shard, activation checkpointing",
       options_for(ShardingStrategy::kFullShard).activation_checkpointing(true)},
      {"shard_grad_op", options_for(ShardingStrategy::kShardGradOp)},
      {"zero1", options_for(ShardingStrategy::kZero1)},
      {"hybrid_shard", options_for(ShardingStrategy::kHybridShard)},
  };
  if (W > 1) {  // ZeRO++'s secondary partition (exact), the frozen part's kept too: hosts of W / 2 ranks (or 1)
    const int host_ranks = W % 2 == 0 ? W / 2 : 1;
    cases.emplace_back("full_shard, hpZ", options_for(ShardingStrategy::kFullShard, torch::kFloat, host_ranks)
                                              .zero_plus_plus(fsdp::ZeroPlusPlus().secondary_partition(true)));
  }
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name);
    auto sharded = fsdp::fully_shard(make_partly_frozen_gpt(), world_group, options);
    const auto adamw = fsdp::testing::spec_adamw().weight_decay(0.5);
    torch::optim::AdamW sharded_opt(sharded.parameters(), adamw);
    GPT reference = make_partly_frozen_gpt();
    std::vector<torch::Tensor> reference_params;
    for (const auto& p : fsdp::testing::unique_parameters(*reference))
      if (p.requires_grad()) reference_params.push_back(p);
    torch::optim::AdamW reference_opt(reference_params, adamw);
    for (int64_t step = 0; step < steps; ++step) {
      auto [x, y] = fsdp::testing::batch(data, step, 0, 1, B);
      torch::Tensor loss = sharded.forward(x, y);
      loss.backward();
      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);  // the global batch, as one rank of one
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      if (step == 0) expect_trainable_gradients_match(sharded.state(), *reference);
      sharded_opt.step();
      sharded_opt.zero_grad();
      reference_opt.step();
      reference_opt.zero_grad();
      world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();
      EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>())
          << "step " << step;
    }
    for (const auto& [name, value] : fsdp::testing::full_values(sharded.state())) {
      const torch::Tensor expected = reference->named_parameters()[name].detach();
      if (is_frozen(name)) {
        EXPECT_TRUE(torch::equal(value, expected)) << name;
      } else {
        EXPECT_LT((value - expected).abs().max().item<double>(), 1e-4) << name;
      }
    }
  }
}

// The full and sharded state dicts hold the frozen parameters under their
// names and load back into them; save_full_state_dict writes them to the
// model file and no state of theirs to the optimizer's; sharded
// initialization (param_init_fn) fills them as it fills the others.
TEST(FrozenParameters, StateDictsAndShardedInitCoverThem) {
  auto model = fsdp::fully_shard(make_partly_frozen_gpt(), world_group, fsdp::testing::block_units());
  fsdp::StateDict dict = fsdp::full_state_dict(model.state());
  GPT plain = fsdp::testing::make_gpt(fsdp::testing::tiny());
  int frozen = 0;
  for (const auto& [name, param] : fsdp::unique_named_parameters(*plain)) {
    const torch::Tensor* value = dict.find(name);
    ASSERT_TRUE(value) << name;
    EXPECT_TRUE(torch::equal(*value, param.detach())) << name;
    frozen += is_frozen(name);
  }
  EXPECT_GT(frozen, 0);
  // Into a model of other values, and back out the same.
  GPT other_model = fsdp::testing::make_gpt(fsdp::testing::tiny(), /*seed=*/2);
  for (auto& [name, param] : fsdp::unique_named_parameters(*other_model))
    if (is_frozen(name)) param.requires_grad_(false);
  auto other = fsdp::fully_shard(other_model, world_group, fsdp::testing::block_units());
  fsdp::load_full_state_dict(other.state(), dict);
  fsdp::testing::expect_same_params(model.state(), other.state(), "after load_full_state_dict");

  // After a step: the sharded state dict holds the frozen ones too, and
  // loads back; the full files hold them in the model file and nothing of
  // them in the optimizer's.
  const auto& data = fsdp::testing::token_data();
  auto [x, y] = fsdp::testing::batch(data, 0, 0, 1, 2);
  fsdp::FusedAdamW optimizer(model.parameters(), fsdp::testing::spec_adamw());
  model.forward(x, y).backward();
  optimizer.step();
  fsdp::load_sharded_state_dict(other.state(), fsdp::sharded_state_dict(model.state()));
  fsdp::testing::expect_same_params(model.state(), other.state(), "after load_sharded_state_dict");
  const std::string path = "/tmp/fsdp_test_frozen_w" + std::to_string(world_group->size());
  fsdp::save_full_state_dict(model.state(), path + ".model.safetensors", {}, &optimizer,
                             path + ".optimizer.safetensors");
  GPT unsharded{fsdp::testing::tiny()};
  fsdp::load_full_weights(*unsharded, path + ".model.safetensors");
  const auto saved = fsdp::testing::full_params(model.state());
  for (const auto& [name, param] : fsdp::unique_named_parameters(*unsharded)) {
    EXPECT_TRUE(torch::equal(param, saved.at(name))) << name << " in the saved model file";
  }
  int moments = 0;
  const fsdp::safetensors::Reader optimizer_file(path + ".optimizer.safetensors");
  for (const auto& t : optimizer_file.tensors()) {
    EXPECT_FALSE(is_frozen(t.spec.name)) << t.spec.name << " has optimizer state in the file";
    ++moments;
  }
  EXPECT_EQ(moments, 2 * static_cast<int>(saved.size() - frozen));

  // Sharded init: every parameter, frozen or not, drawn as make_gpt draws it.
  GPT deferred = [] {
    fsdp::memory::DeferredInit no_values;
    GPT m{fsdp::testing::tiny()};
    for (auto& [name, param] : fsdp::unique_named_parameters(*m))
      if (is_frozen(name)) param.requires_grad_(false);
    return m;
  }();
  auto init_values = fsdp::unique_named_parameters(*plain);
  std::map<std::string, torch::Tensor> by_name(init_values.begin(), init_values.end());
  auto initialized = fsdp::fully_shard(
      deferred, world_group,
      fsdp::testing::block_units().param_init_fn([&](const std::string& name, torch::Tensor& param) {
        torch::NoGradGuard no_grad;
        param.copy_(by_name.at(name));
      }));
  for (const auto& [name, value] : fsdp::testing::full_params(initialized.state())) {
    EXPECT_TRUE(torch::equal(value, *dict.find(name))) << name << " after sharded init";
  }
  EXPECT_EQ(initialized.parameters().size(), model.parameters().size());
}

// LoRA (fsdp::lora::apply before fully_shard) at W = 1 to 4: the adapters
// train as one process with the global batch trains them (relative 1e-4 on
// the gradients, as above), the base stays bit for bit what it was, the
// optimizer holds moments for the adapters' shards only, and one step
// reduce-scatters the trainable parts' bytes only.
TEST(Lora, TrainsTheSameAdaptersAsOneProcess) {
  const int W = world_group->size();
  const int64_t B = 2, steps = 4;
  const auto& data = fsdp::testing::token_data();
  auto make = [] {
    GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
    fsdp::lora::apply(*model, fsdp::lora::LoraOptions().rank(4).alpha(8).targets({"c_attn", "c_proj"}).seed(3));
    return model;
  };
  using fsdp::testing::options_for;
  const std::vector<std::pair<std::string, fsdp::FullyShardOptions>> cases = {
      {"full_shard", options_for(ShardingStrategy::kFullShard)},
      {"full_shard, activation checkpointing", options_for(ShardingStrategy::kFullShard).activation_checkpointing(true)},
      {"zero1", options_for(ShardingStrategy::kZero1)},
  };
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name);
    auto sharded = fsdp::fully_shard(make(), world_group, options);
    const auto initial = fsdp::testing::full_params(sharded.state());
    const auto adamw = fsdp::testing::spec_adamw().weight_decay(0.5);
    torch::optim::AdamW sharded_opt(sharded.parameters(), adamw);
    GPT reference = make();
    std::vector<torch::Tensor> reference_params;
    for (const auto& p : fsdp::testing::unique_parameters(*reference))
      if (p.requires_grad()) reference_params.push_back(p);
    torch::optim::AdamW reference_opt(reference_params, adamw);
    fsdp::TrainStep train_step(sharded, sharded_opt, fsdp::TrainStepOptions().gather_rank_figures(false));
    for (int64_t step = 0; step < steps; ++step) {
      auto [x, y] = fsdp::testing::batch(data, step, 0, 1, B);
      torch::Tensor loss;
      const fsdp::StepResult result = train_step([&](int64_t) { return loss = sharded.forward(x, y); });
      auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);
      torch::Tensor reference_loss = reference->forward(gx, gy);
      reference_loss.backward();
      reference_opt.step();
      reference_opt.zero_grad();
      EXPECT_NEAR(result.loss, reference_loss.item<double>(), 1e-5 * reference_loss.item<double>()) << "step " << step;
      if (step == 0 && name == "full_shard") {
        int64_t reduced = 0;
        for (const auto& unit : fsdp::detail::units(sharded.state())) reduced += unit->flat_param().padded_numel();
        EXPECT_EQ(result.comm.bytes[static_cast<size_t>(fsdp::CollectiveKind::kReduceScatter)], 4 * reduced);
      }
    }
    int64_t state_numel = 0;
    for (const auto& shard : sharded.parameters()) {
      auto it = sharded_opt.state().find(fsdp::compat::optimizer_state_key(sharded_opt, shard));
      if (it == sharded_opt.state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      state_numel += s.exp_avg().numel() + s.exp_avg_sq().numel();
    }
    EXPECT_EQ(state_numel, 2 * trainable_shard_numel(sharded.state()));
    for (const auto& [param_name, value] : fsdp::testing::full_values(sharded.state())) {
      const torch::Tensor expected = reference->named_parameters()[param_name].detach();
      if (fsdp::lora::is_adapter_parameter(param_name)) {
        EXPECT_LT((value - expected).abs().max().item<double>(), 1e-4) << param_name;
        EXPECT_FALSE(torch::equal(value, initial.at(param_name))) << param_name << " did not train";
      } else {
        EXPECT_TRUE(torch::equal(value, initial.at(param_name))) << param_name << " (frozen) changed";
        EXPECT_TRUE(torch::equal(value, expected)) << param_name;
      }
    }
  }
}

// `steps` steps of a sharded model and of one process training the same
// model on each step's whole global batch (W B sequences): the trainable
// gradients compared at the first step (relative to their largest element,
// `gradient_tolerance`), the losses at every step (relative, `loss_tolerance`).
template <typename Sharded>
void train_alongside(Sharded& sharded, fsdp::models::GPTImpl& reference, torch::optim::Optimizer& sharded_opt,
                     torch::optim::Optimizer& reference_opt, int64_t steps, int64_t B, double gradient_tolerance,
                     double loss_tolerance) {
  const int W = world_group->size();
  const auto& data = fsdp::testing::token_data();
  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = fsdp::testing::batch(data, step, 0, 1, B);
    torch::Tensor loss = sharded.forward(x, y);
    loss.backward();
    auto [gx, gy] = data.batch(step, 0, 0, 1, 1, W * B);
    torch::Tensor reference_loss = reference.forward(gx, gy);
    reference_loss.backward();
    if (step == 0) expect_trainable_gradients_match(sharded.state(), reference, gradient_tolerance);
    reference_opt.step();
    reference_opt.zero_grad();
    sharded_opt.step();
    sharded_opt.zero_grad();
    world_group->all_reduce(loss, fsdp::ReduceOp::kAvg)->wait();
    EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), loss_tolerance * reference_loss.item<double>())
        << "step " << step;
  }
}

// How far an adapter's gradient through a bf16 base may differ between two
// batch splits, relative to its largest element: every bf16 rounding on its
// path is off by at most 2^-8 of its value, and another split of the batch
// (W ranks of B against one process of W B) may round each otherwise, where
// the CPU's bf16 kernels block the product by its rows (oneDNN's AVX-512 BF16
// and AMX ones do not, so agree to 2e-2; AVX2-only CPUs, which emulate bf16,
// differed by 0.029 to 0.053). The path: each block's four base linears (the
// attention's two, the MLP's two) in forward and again in backward, and the
// head both ways; to first order the bound is their count times 2^-8 (0.07
// for the tiny GPT's 2 layers). A bug of sharding (a missing reduction, a
// wrong average, a wrong shard) is off by 1 / W or more.
static double bf16_path_tolerance(int64_t layers) { return (8.0 * layers + 2) / 256.0; }

// MixedPrecision::frozen_param_dtype(bf16) under LoRA (fsdp-train
// --base-dtype bf16): the base's shards are held in bf16 (2 bytes an
// element), gathered and computed in it, its values rounded once and then
// never changed; the fp32 adapters train as one process with the same bf16
// base trains them (to bf16's rounding of other batch splits); the state
// dict holds the bf16 values exactly, in fp32.
TEST(Lora, HoldsTheBaseInBf16AsOneProcessWould) {
  const int64_t B = 2, steps = 3, layers = fsdp::testing::tiny().layers;
  auto make = [] {
    GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
    fsdp::lora::apply(*model, fsdp::lora::LoraOptions().rank(4).alpha(8).targets({"c_attn", "c_fc"}).seed(3));
    return model;
  };
  const fsdp::memory::Usage before = fsdp::memory::usage();
  auto sharded = fsdp::fully_shard(make(), world_group, fsdp::testing::block_units().mixed_precision(fsdp::MixedPrecision().frozen_param_dtype(torch::kBFloat16)));
  int64_t frozen_numel = 0, trainable_numel = 0;
  for (const fsdp::FlatParam* flat : fsdp::detail::flat_params(sharded.state())) {
    (flat->frozen() ? frozen_numel : trainable_numel) += flat->shard_numel();
    EXPECT_EQ(flat->shard().scalar_type(), flat->frozen() ? torch::kBFloat16 : torch::kFloat) << flat->name();
  }
  EXPECT_EQ(fsdp::memory::usage().live(Category::kParameterShard) - before.live(Category::kParameterShard),
            2 * frozen_numel + 4 * trainable_numel);
  const auto initial = fsdp::testing::full_params(sharded.state());
  GPT reference = make();
  std::vector<torch::Tensor> reference_params;
  for (auto& [name, param] : fsdp::unique_named_parameters(*reference)) {
    if (param.requires_grad()) {
      reference_params.push_back(param);
    } else {
      param.set_data(param.detach().to(torch::kBFloat16));
      EXPECT_TRUE(torch::equal(param.to(torch::kFloat), initial.at(name))) << name << ": rounded once, to bf16";
    }
  }
  const auto adamw = fsdp::testing::spec_adamw();
  torch::optim::AdamW sharded_opt(sharded.parameters(), adamw);
  torch::optim::AdamW reference_opt(reference_params, adamw);
  train_alongside(sharded, *reference, sharded_opt, reference_opt, steps, B, bf16_path_tolerance(layers), 2e-3);
  for (const auto& [name, value] : fsdp::testing::full_params(sharded.state())) {
    EXPECT_EQ(value.scalar_type(), torch::kFloat) << name;
    if (fsdp::lora::is_adapter_parameter(name)) {
      // Trained; not compared with the reference's values: Adam turns the
      // bf16 rounding of other batch splits in near-zero gradients (A's,
      // while B is still near zero) into whole steps of either sign. The
      // gradients and losses above are the comparison.
      EXPECT_FALSE(torch::equal(value, initial.at(name))) << name << " did not train";
    } else {
      EXPECT_TRUE(torch::equal(value, initial.at(name))) << name << " (the bf16 base) changed";
    }
  }
}

// MixedPrecision::frozen_nf4 under LoRA (QLoRA; fsdp-train --base-dtype
// nf4): every linear weight of the base is held as bitsandbytes' NF4
// records (36 bytes a block of 64), sharded and gathered as bytes and
// dequantized in fp32 here; the adapters train as one process whose
// linear weights are those dequantized values trains them; the bytes never
// change; a sharded checkpoint holds them and loads them back bit for bit.
TEST(Lora, HoldsTheBaseInNf4AsOneProcessWould) {
  const int W = world_group->size();
  const int64_t B = 2, steps = 3;
  auto make = [](uint64_t seed) {
    GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
    fsdp::lora::apply(*model, fsdp::lora::LoraOptions().rank(4).alpha(8).targets({"c_attn", "c_fc"}).seed(seed));
    return model;
  };
  const fsdp::FullyShardOptions options =
      fsdp::testing::block_units().mixed_precision(fsdp::MixedPrecision().frozen_nf4(true));
  const fsdp::memory::Usage before = fsdp::memory::usage();
  auto sharded = fsdp::fully_shard(make(3), world_group, options);
  int64_t shard_bytes = 0, nf4_elements = 0;
  std::vector<torch::Tensor> records;
  for (const fsdp::FlatParam* flat : fsdp::detail::flat_params(sharded.state())) {
    if (flat->nf4()) {
      EXPECT_EQ(flat->shard().scalar_type(), torch::kByte) << flat->name();
      EXPECT_EQ(flat->shard().numel(), flat->shard_numel() / 64 * 36) << flat->name();
      records.push_back(flat->shard().clone());
      nf4_elements += flat->shard_numel();
    }
    shard_bytes += flat->shard().nbytes();
  }
  EXPECT_EQ(records.size(), static_cast<size_t>(fsdp::testing::tiny().layers)) << "one NF4 buffer a block: its four linears";
  EXPECT_EQ(fsdp::memory::usage().live(Category::kParameterShard) - before.live(Category::kParameterShard), shard_bytes);
  // The reference: one process whose linear weights are their NF4 values
  // (each weight quantized alone, as bitsandbytes does).
  GPT reference = make(3);
  std::vector<torch::Tensor> reference_params;
  int64_t quantized = 0;
  for (const auto& item : reference->named_modules()) {
    if (!dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) continue;
    auto own = item.value()->named_parameters(/*recurse=*/false);
    torch::Tensor* weight = own.find("weight");
    if (weight->requires_grad()) continue;  // LoRA's B, a Linear too
    const fsdp::nf4::Quantized q = fsdp::nf4::quantize(*weight);
    weight->set_data(fsdp::nf4::dequantize(q.packed, q.absmax, weight->numel(), torch::kFloat).view(weight->sizes()));
    ++quantized;
  }
  EXPECT_EQ(quantized, 4 * fsdp::testing::tiny().layers) << "every block's four linears, adapted or not; not the head";
  const auto initial = fsdp::testing::full_params(sharded.state());
  for (auto& [name, param] : fsdp::unique_named_parameters(*reference)) {
    if (param.requires_grad()) reference_params.push_back(param);
    EXPECT_TRUE(torch::equal(param.detach(), initial.at(name))) << name << ": the NF4 values";
  }
  const auto adamw = fsdp::testing::spec_adamw();
  torch::optim::AdamW sharded_opt(sharded.parameters(), adamw);
  torch::optim::AdamW reference_opt(reference_params, adamw);
  train_alongside(sharded, *reference, sharded_opt, reference_opt, steps, B, 1e-5, 1e-5);
  size_t k = 0;
  for (const fsdp::FlatParam* flat : fsdp::detail::flat_params(sharded.state())) {
    if (flat->nf4()) EXPECT_TRUE(torch::equal(flat->shard(), records[k++])) << flat->name() << ": the NF4 bytes changed";
  }
  // A sharded checkpoint holds the bytes; another model (other adapters)
  // loads them back bit for bit.
  const std::string dir = (std::filesystem::temp_directory_path() / ("fsdp_nf4_w" + std::to_string(W))).string();
  const std::string path = fsdp::save_checkpoint(sharded.state(), sharded_opt, dir, steps);
  auto resumed = fsdp::fully_shard(make(4), world_group, options);
  torch::optim::AdamW resumed_opt(resumed.parameters(), adamw);
  fsdp::load_checkpoint(resumed.state(), resumed_opt, path);
  k = 0;
  for (const fsdp::FlatParam* flat : fsdp::detail::flat_params(resumed.state())) {
    if (flat->nf4()) EXPECT_TRUE(torch::equal(flat->shard(), records[k++])) << flat->name() << ": loaded bytes";
  }
  // Resumed, the next step is the straight run's, bit for bit.
  for (auto* run : {&sharded, &resumed}) {
    auto [x, y] = fsdp::testing::batch(fsdp::testing::token_data(), steps, 0, 1, B);
    run->forward(x, y).backward();
    (run == &sharded ? sharded_opt : resumed_opt).step();
  }
  const auto straight = fsdp::testing::full_params(sharded.state());
  for (const auto& [name, value] : fsdp::testing::full_params(resumed.state())) {
    EXPECT_TRUE(torch::equal(value, straight.at(name))) << name << " after a step from the checkpoint";
  }
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  // Refused: an offload (its shards are float32), naming the option.
  const std::string refusal = fsdp::testing::message_of(
      [&] { fsdp::fully_shard(make(3), world_group, fsdp::FullyShardOptions(options).offload(fsdp::OffloadPolicy::cpu())); });
  EXPECT_NE(refusal.find("frozen_nf4 with an offload"), std::string::npos) << refusal;
}
