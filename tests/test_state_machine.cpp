// The units' state machine at W = 2, 3 and 4: units unsharded only inside
// their forward and backward, illegal transitions and different models on
// different ranks refused, a unit called outside unit_forward named, and a
// failed backward leaving the model usable.

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "fsdp/token_data.h"
#include "probe_net.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "base/memory_counters.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::ShardingStrategy;
using fsdp::memory::Category;
using fsdp::UnitState;
using fsdp::testing::world_group;
using fsdp::testing::ProbeBlockImpl;
using fsdp::testing::ProbeNet;
using fsdp::testing::ShardedAndReference;
using fsdp::testing::block_units;
using fsdp::testing::data_for;
using fsdp::testing::kProbeWidth;
using fsdp::testing::make_gpt;
using fsdp::testing::name_of;
using fsdp::testing::options_for;
using fsdp::testing::probe_unit_bytes;
using fsdp::testing::tiny;

TEST(StateMachine, UnitsAreUnshardedOnlyInsideTheirForwardAndBackward) {
  const int W = world_group->size();
  const int64_t width = kProbeWidth, unit_bytes = probe_unit_bytes(W);
  const int depth = 3;
  fsdp::FsdpState* state = nullptr;
  std::vector<std::string> violations;
  int forward_probes = 0, backward_probes = 0;
  int64_t unsharded_baseline = 0, gathered_baseline = 0;
  auto probe = [&](int index, bool in_backward) {
    (in_backward ? backward_probes : forward_probes)++;
    // units()[0] is the root, units()[i + 1] block i.
    for (size_t u = 0; u < fsdp::detail::units(*state).size(); ++u) {
      const auto& unit = fsdp::detail::units(*state)[u];
      bool must_be_unsharded = u == 0 || static_cast<int>(u) == index + 1;
      UnitState expected = !must_be_unsharded ? UnitState::kSharded
                           : in_backward      ? UnitState::kBackward
                                              : UnitState::kForward;
      if (unit->state() != expected || unit->flat_param().is_unsharded() != must_be_unsharded) {
        violations.push_back("probe of block " + std::to_string(index) + (in_backward ? " (backward)" : " (forward)") +
                             ": unit " + unit->display_name() + " is " + fsdp::unit_state_name(unit->state()));
      }
    }
    if (!in_backward) {
      const int64_t expected = 2 * unit_bytes;  // the root's parameters and the running block's
      int64_t live = fsdp::memory::usage().live(Category::kUnshardedBuffer) - unsharded_baseline;
      if (live != expected)
        violations.push_back("forward of block " + std::to_string(index) + ": " + std::to_string(live) +
                             " unsharded bytes live, expected " + std::to_string(expected));
    }
    // The gathered parameter buffers alone (what a GPU run reports as its
    // device split): the root's and the running block's, in both passes.
    const int64_t gathered = fsdp::memory::gathered_usage().live - gathered_baseline;
    if (gathered != 2 * unit_bytes)
      violations.push_back(std::string(in_backward ? "backward" : "forward") + " of block " + std::to_string(index) +
                           ": " + std::to_string(gathered) + " gathered bytes live, expected " +
                           std::to_string(2 * unit_bytes));
  };
  torch::manual_seed(3);
  ProbeNet net(width, depth, probe);
  unsharded_baseline = fsdp::memory::usage().live(Category::kUnshardedBuffer);
  // Without prefetch: exactly the running unit (and the root) is gathered.
  auto model = fsdp::fully_shard(net, world_group,
                                 fsdp::FullyShardOptions()
                                     .wrap_policy(fsdp::module_type_policy<ProbeBlockImpl>())
                                     .backward_prefetch(fsdp::BackwardPrefetch::kNone));
  state = &model.state();
  gathered_baseline = fsdp::memory::gathered_usage().live;
  torch::manual_seed(100 + world_group->rank());
  for (int step = 0; step < 2; ++step) {
    fsdp::memory::reset_peaks();
    model.forward(torch::randn({5, width})).backward();
    model.state().check_idle();
    EXPECT_EQ(fsdp::memory::usage().live(Category::kUnshardedBuffer), unsharded_baseline);
    EXPECT_EQ(fsdp::memory::gathered_usage().live, gathered_baseline) << "every gathered buffer is freed";
    EXPECT_EQ(fsdp::memory::gathered_usage().peak, gathered_baseline + 2 * unit_bytes);
  }
  EXPECT_EQ(forward_probes, 2 * depth);
  EXPECT_EQ(backward_probes, 2 * depth);
  for (const auto& v : violations) ADD_FAILURE() << v;
}

TEST(StateMachine, IllegalTransitionsAreRefused) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  fsdp::Unit& block = *fsdp::detail::units(model.state())[1];
  // Reshard a unit that is not unsharded; gather one already gathered.
  EXPECT_THROW(block.post_forward(), c10::Error);
  block.pre_forward();
  try {
    block.pre_forward();
    ADD_FAILURE() << "a second pre_forward was accepted";
  } catch (const c10::Error& e) {
    std::string msg = fsdp::error_message(e);
    EXPECT_NE(msg.find("illegal transition"), std::string::npos) << msg;
    EXPECT_NE(msg.find("transformer.h.0"), std::string::npos) << msg;
  }
  block.post_forward();
  model.state().check_idle();
}

TEST(StateMachine, DifferentModelsOnDifferentRanksAreRefusedBeforeSharding) {
  const int W = world_group->size(), r = world_group->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  GPTConfig config = tiny();
  if (r == W - 1) config.layers = 3;  // one rank builds a deeper model
  GPT model = make_gpt(config);
  try {
    fsdp::fully_shard(model, world_group, block_units());
    ADD_FAILURE() << "different models were sharded together";
  } catch (const c10::Error& e) {
    std::string msg = fsdp::error_message(e);
    EXPECT_NE(msg.find("the ranks sharded different models"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0: 3 units"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(W - 1) + ": 4 units"), std::string::npos) << msg;
  }
  EXPECT_GT(model->transformer->wte->weight.numel(), 0) << "a refused model lost its parameters";
}

namespace {
// Calls its second block directly, bypassing the unit boundary.
struct CarelessNetImpl : torch::nn::Module {
  CarelessNetImpl() : blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int i = 0; i < 2; ++i) blocks->push_back(torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = fsdp::unit_forward(*blocks[0]->as<torch::nn::LinearImpl>(), x);
    return blocks[1]->as<torch::nn::LinearImpl>()->forward(h).sum();
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(CarelessNet);
}  // namespace

TEST(StateMachine, CallingAUnitOutsideUnitForwardIsAClearError) {
  auto model = fsdp::fully_shard(CarelessNet(), world_group,
                                 fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<torch::nn::LinearImpl>()));
  try {
    model.forward(torch::ones({2, 8}));
    ADD_FAILURE() << "a sharded module ran outside its unit";
  } catch (const c10::Error& e) {
    std::string msg = fsdp::error_message(e);
    EXPECT_NE(msg.find("units not entered through fsdp::unit_forward before this error: blocks.1"), std::string::npos)
        << msg;
  }
  model.state().check_idle();  // the failed forward left every unit sharded
}

// A backward that throws never reaches its end-of-backward callback; the
// next forward must put every unit back to rest and train on normally.
TEST(StateMachine, AFailedBackwardLeavesTheModelUsable) {
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
