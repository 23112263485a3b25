// FULL_SHARD on 2, 3 and 4 ranks: the same training as one process with the
// global batch, exact per-rank shares measured by the allocator, units
// unsharded only inside their forward and backward, the gathered and
// gradient buffers that prefetch, the limiter and activation checkpointing
// keep alive (measured by the allocator in forward and backward), tied
// weights, wrap policies and the state machine.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "core/unit.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/memory.h"
#include "offload/nvme_offload.h"
#include "fsdp/state_dict.h"
#include "fsdp/train_step.h"
#include "fsdp/token_data.h"
#include "fsdp/trace.h"
#include "mpi_test_env.h"
#include "test_helpers.h"

using fsdp::UnitState;
using fsdp::memory::Category;
using fsdp::models::GPT;
using fsdp::models::GPTConfig;
using fsdp::testing::world_group;

namespace {

using fsdp::testing::tiny;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;

using fsdp::testing::block_units;

// The full value of a unit's parameters, gathered from the shards.
torch::Tensor gather_flat(const fsdp::FlatParam& flat, const torch::Tensor& shard_tensor) {
  torch::Tensor full = torch::empty({flat.padded_numel()});
  world_group->all_gather(full, shard_tensor.detach().contiguous())->wait();
  return full;
}

using fsdp::testing::expect_gradients_match;

}  // namespace

// The project's first correctness test: W ranks with batch B train the same
// model as 1 process with batch W*B. Tolerance: relative 1e-5 on each step's
// loss. Both runs compute the same sums in a different order (per-rank
// means averaged vs one mean over W*B rows), so they differ by float32
// rounding: ~1e-7 relative per step (measured: at most 2.3e-7 over 12 steps
// at W = 2 and 4). A real error (a sum instead of a mean, a wrong data
// slice, a gradient lost at a unit boundary) moves the loss by 1e-3 or more
// within two steps.
TEST(FullShard, TrainsTheSameModelAsOneProcessWithTheGlobalBatch) {
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
  for (const auto& unit : sharded.state().units()) {
    const auto& flat = unit->flat_param();
    torch::Tensor full = gather_flat(flat, flat.shard());
    for (const auto& e : flat.entries()) {
      torch::Tensor expected = reference->named_parameters()[e.name].detach();
      EXPECT_LT((full.narrow(0, e.offset, e.numel).view(e.shape) - expected).abs().max().item<double>(), 1e-4)
          << e.name;
    }
  }
}

TEST(FullShard, EachRankHoldsExactlyItsShareMeasuredByTheAllocator) {
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
  ASSERT_EQ(static_cast<int64_t>(sharded.state().units().size()), config.layers + 1);
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

namespace {

// The probe models' units (the root's embedding and each block) are one
// Linear(25, 25) each: 650 elements, which pad at W = 3 (to 651) and 4 (to 652).
constexpr int64_t kProbeWidth = 25;

// The bytes of one probe unit's gathered fp32 buffer (or full-size gradient
// buffer) at W ranks: its elements padded to a multiple of W, from the spec.
int64_t probe_unit_bytes(int W) {
  const int64_t numel = kProbeWidth * kProbeWidth + kProbeWidth;
  return (numel + W - 1) / W * W * 4;
}

// A block that reports, from inside its forward and its backward, which
// units are unsharded and how many bytes of unsharded buffers are live.
struct ProbeBlockImpl : torch::nn::Module {
  using Probe = std::function<void(int index, bool in_backward)>;
  ProbeBlockImpl(int index, int64_t width, Probe probe)
      : index(index), probe(std::move(probe)), fc(register_module("fc", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    probe(index, false);
    torch::Tensor h = fc(x);
    if (h.requires_grad()) {
      auto report = probe;
      int i = index;
      h.register_hook([report, i](const torch::Tensor&) { report(i, true); });
    }
    return x + torch::tanh(h);
  }
  int index;
  Probe probe;
  torch::nn::Linear fc;
};
TORCH_MODULE(ProbeBlock);

struct ProbeNetImpl : torch::nn::Module {
  ProbeNetImpl(int64_t width, int depth, ProbeBlockImpl::Probe probe)
      : embed(register_module("embed", torch::nn::Linear(width, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int i = 0; i < depth; ++i) blocks->push_back(ProbeBlock(i, width, probe));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = embed(x);
    for (const auto& block : *blocks) h = fsdp::unit_forward(*block->as<ProbeBlockImpl>(), h);
    return h.pow(2).mean();
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(ProbeNet);

}  // namespace

TEST(FullShard, UnitsAreUnshardedOnlyInsideTheirForwardAndBackward) {
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
    for (size_t u = 0; u < state->units().size(); ++u) {
      const auto& unit = state->units()[u];
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

// With prefetch, the unit that runs next is being gathered while one runs:
// in forward the next block, in backward the previous one. The limiter
// holds it to one unit ahead even when prefetch asks for two; without it,
// two are gathered ahead. Both are measured by the allocator's unsharded
// bytes, in forward and in backward, against what the limiter allows:
//   forward:  the root's parameters, the running block's, one prefetched;
//   backward: the root's parameters and gradient buffer, the running
//             block's parameters and gradient buffer, one prefetched, and
//             the previous block's gradient while its reduction may still be
//             in flight (none before the first block in backward, where the
//             bound is exact).
// Without the limiter the bound is exceeded in both. Training is unchanged
// (the losses match a run without prefetch exactly).
TEST(FullShard, PrefetchGathersTheNextUnitAheadWithinTheLimiter) {
  const int W = world_group->size();
  const int64_t width = kProbeWidth, unit_bytes = probe_unit_bytes(W);
  const int depth = 4;
  for (bool limit : {true, false}) {
    SCOPED_TRACE(limit ? "limited" : "unlimited");
    fsdp::FsdpState* state = nullptr;
    std::vector<std::string> violations;
    int64_t baseline = 0;
    bool check = false, exceeded = false;
    auto probe = [&](int index, bool in_backward) {
      if (!check) return;
      const char* pass = in_backward ? "backward" : "forward";
      const int64_t allowed_units = in_backward ? 5 + (index < depth - 1 ? 1 : 0) : 3;
      const int64_t live = fsdp::memory::usage().live(Category::kUnshardedBuffer) - baseline;
      if (live > allowed_units * unit_bytes) {
        exceeded = true;
        if (limit)
          violations.push_back(std::string(pass) + " of block " + std::to_string(index) + ": " + std::to_string(live) +
                               " unsharded bytes live, the limiter allows " + std::to_string(allowed_units * unit_bytes));
      }
      const auto& units = state->units();  // units[0] is the root, units[i + 1] block i
      const int next = in_backward ? index - 1 : index + 1;
      if (next < 0 || next >= depth) return;
      const auto& flat = units[next + 1]->flat_param();
      if (!(flat.unshard_pending() || flat.is_unsharded()) || units[next + 1]->state() != UnitState::kSharded) {
        violations.push_back(std::string(pass) + " of block " + std::to_string(index) + ": block " +
                             std::to_string(next) + " was not prefetched");
      }
    };
    torch::manual_seed(3);
    ProbeNet net(width, depth, probe);
    baseline = fsdp::memory::usage().live(Category::kUnshardedBuffer);
    auto model = fsdp::fully_shard(net, world_group,
                                   fsdp::FullyShardOptions()
                                       .wrap_policy(fsdp::module_type_policy<ProbeBlockImpl>())
                                       .forward_prefetch(true)
                                       .backward_prefetch(fsdp::BackwardPrefetch::kPre)
                                       .prefetch_depth(2)
                                       .limit_all_gathers(limit));
    state = &model.state();
    torch::manual_seed(100 + world_group->rank());
    for (int step = 0; step < 3; ++step) {
      check = step > 0;  // the first pass learns the order
      state->reset_prefetch_stats();
      model.forward(torch::randn({5, width})).backward();
      model.state().check_idle();
      EXPECT_EQ(fsdp::memory::usage().live(Category::kUnshardedBuffer), baseline);
    }
    EXPECT_EQ(state->max_prefetched_unused(), limit ? 1 : 2);
    // The bound is tight enough to tell: two units ahead break it.
    if (!limit) EXPECT_TRUE(exceeded) << "the unlimited run kept within the limiter's bound";
    // A forward without autograd leaves nothing gathered behind.
    {
      torch::NoGradGuard no_grad;
      model.forward(torch::randn({5, width}));
    }
    model.state().check_idle();
    for (const auto& v : violations) ADD_FAILURE() << v;
  }
}

// With activation checkpointing, the previous unit's reduction is finished
// before the recomputed unit's gradient buffer is made: besides the root's,
// one unit's full-size gradient is alive at a time (its buffer, or the input
// of its reduction in flight). Without checkpointing, the previous unit's
// reduction overlaps this unit's backward, and two are. To make the overlap
// certain, the last rank sleeps inside the first block's backward (block
// depth - 1, before its gradients are done), so on the other ranks that
// block's reduction is still in flight while the next block's backward runs.
// The allocator's unsharded bytes, at each block's backward and at the
// step's peak, in units: the root's parameters and gradient buffer (2), the
// running block's parameters and gradient buffer (2), the block prefetched
// ahead (1, but none for block 0), and without checkpointing the held-back
// reduction's input (1).
TEST(FullShard, ActivationCheckpointingKeepsOneFullGradientAliveAtATime) {
  const int W = world_group->size(), r = world_group->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t width = kProbeWidth, unit_bytes = probe_unit_bytes(W);
  const int depth = 3;
  const bool held_back_here = r == W - 1;
  for (bool checkpointing : {true, false}) {
    SCOPED_TRACE(checkpointing ? "with activation checkpointing" : "without activation checkpointing");
    std::vector<std::string> violations;
    int64_t baseline = 0;
    bool check = false;
    auto probe = [&](int index, bool in_backward) {
      if (!check || !in_backward) return;
      if (index == depth - 1 && held_back_here) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const bool after_held_back = index == depth - 2;
      // Without checkpointing, a reduction not held back may or may not have
      // finished by now; on the last rank, the held-back one too.
      if (!checkpointing && (!after_held_back || held_back_here)) return;
      const int64_t expected_units = 4 + (index > 0 ? 1 : 0) + (!checkpointing ? 1 : 0);
      const int64_t live = fsdp::memory::usage().live(Category::kUnshardedBuffer) - baseline;
      if (live != expected_units * unit_bytes)
        violations.push_back("backward of block " + std::to_string(index) + ": " + std::to_string(live) +
                             " unsharded bytes live, expected " + std::to_string(expected_units * unit_bytes));
    };
    torch::manual_seed(3);
    ProbeNet net(width, depth, probe);
    baseline = fsdp::memory::usage().live(Category::kUnshardedBuffer);
    auto model = fsdp::fully_shard(net, world_group,
                                   fsdp::FullyShardOptions()
                                       .wrap_policy(fsdp::module_type_policy<ProbeBlockImpl>())
                                       .backward_prefetch(fsdp::BackwardPrefetch::kPre)
                                       .activation_checkpointing(checkpointing));
    torch::manual_seed(100 + r);
    for (int step = 0; step < 2; ++step) {
      check = step > 0;  // the first pass learns the order prefetch follows
      fsdp::memory::reset_peaks();
      model.forward(torch::randn({5, width})).backward();
      model.state().check_idle();
    }
    const int64_t peak = fsdp::memory::usage().peak(Category::kUnshardedBuffer) - baseline;
    if (checkpointing) {
      EXPECT_EQ(peak, 5 * unit_bytes) << "the step's peak of unsharded bytes";
    } else if (!held_back_here) {
      EXPECT_EQ(peak, 6 * unit_bytes) << "the step's peak of unsharded bytes";
    }
    for (const auto& v : violations) ADD_FAILURE() << v;
  }
}

// A model built under DeferredInit has shapes but no memory of its own;
// fully_shard refuses it without an init function, and with one gives
// exactly the shards of a model initialized whole.
TEST(FullShard, ShardedInitializationGivesTheShardsOfTheWholeModel) {
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

// fully_shard sizes the host block cache to six of its largest unit's fp32
// buffers (the option off leaves it alone), and a later step's gathers come
// from the cache: it holds blocks between steps.
TEST(FullShard, TheBlockCacheIsSizedToTheLargestUnitAndReusedAcrossSteps) {
  namespace mem = fsdp::memory;
  const int64_t saved_limit = mem::block_cache_limit();
  mem::set_block_cache_limit(0);
  GPTConfig config = tiny();
  config.width = 256;  // units of 12 * 256^2 elements: 3 MiB of fp32, above the cache's 1 MiB floor
  auto off = fsdp::fully_shard(fsdp::testing::make_gpt(config, 5), world_group, block_units().cache_host_blocks(false));
  EXPECT_EQ(mem::block_cache_limit(), 0) << "cache_host_blocks(false) leaves the limit alone";
  auto model = fsdp::fully_shard(fsdp::testing::make_gpt(config, 5), world_group, block_units());
  int64_t largest = 0;
  for (const auto& unit : model.state().units()) largest = std::max(largest, unit->flat_param().padded_numel());
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

// The GPT's lm head is the token embedding: its gradient must be the sum of
// the embedding's and the head's, the same as one process computes.
TEST(FullShard, TiedWeightsReceiveTheSumOfBothUsesGradients) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("tied", 5000, config.vocab), config.context,
                               config.vocab);
  auto sharded = fsdp::fully_shard(make_gpt(config), world_group, block_units());
  auto [x, y] = data.batch(0, 0, r, W, 1, 2);
  sharded.forward(x, y).backward();
  const auto& root = sharded.state().units().front()->flat_param();
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

TEST(FullShard, APolicyThatSplitsTiedWeightsIsRefused) {
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

TEST(FullShard, IllegalTransitionsAreRefused) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  fsdp::Unit& block = *model.state().units()[1];
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

TEST(FullShard, DifferentModelsOnDifferentRanksAreRefusedBeforeSharding) {
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

TEST(FullShard, CallingAUnitOutsideUnitForwardIsAClearError) {
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

// Units per attention and per MLP (the trainer's --wrap sublayer), with and
// without activation checkpointing: the first step's gradients are the
// single-process ones, and the largest gathered buffer is an MLP's, not a
// block's.
TEST(FullShard, SublayerUnitsGiveTheGradientsOfOneProcess) {
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
    ASSERT_EQ(sharded.state().units().size(), static_cast<size_t>(1 + 2 * config.layers));
    auto [x, y] = data.batch(0, 0, r, W, 1, 2);
    sharded.forward(x, y).backward();
    expect_gradients_match(sharded.state(), *reference, 1e-4,
                           checkpointing ? " with activation checkpointing" : " without activation checkpointing");
    sharded.state().check_idle();
  }
}

namespace {
// Two linear units, the first fed raw data (which requires no gradient).
struct DataFedNetImpl : torch::nn::Module {
  DataFedNetImpl() {
    first = register_module("first", torch::nn::Linear(8, 16));
    second = register_module("second", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // A holder and a shared_ptr: both name the module.
    return fsdp::unit_forward(second, torch::tanh(fsdp::unit_forward(first.ptr(), x))).sum();
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(DataFedNet);
}  // namespace

// A checkpointed unit whose input needs no gradient still gets its
// parameters' gradients (its recompute must not be skipped by autograd).
TEST(FullShard, ACheckpointedUnitFedDataGetsItsGradients) {
  torch::manual_seed(3);
  DataFedNet reference;
  DataFedNet copy;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < reference->parameters().size(); ++i) copy->parameters()[i].copy_(reference->parameters()[i]);
  torch::Tensor x = torch::randn({4, 8});
  {
    torch::AutoGradMode grad_on(true);
    reference->forward(x).backward();
    auto sharded = fsdp::fully_shard(copy, world_group,
                                     fsdp::FullyShardOptions()
                                         .wrap_policy(fsdp::module_type_policy<torch::nn::LinearImpl>())
                                         .activation_checkpointing(true));
    sharded.forward(x).backward();
    expect_gradients_match(sharded.state(), *reference, 1e-5);
  }
}

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

// A user's own loop on a disk-offloaded model (loss.backward(); then their
// optimizer's step) cannot train: no step of theirs brings each unit's
// state from disk into memory around its update. So the backward is refused,
// naming fsdp::TrainStep, before it changes anything: the same model then
// trains through TrainStep, bit for bit as the in-memory one.
TEST(FullShard, DiskOffloadRefusesAPlainBackwardAndStaysUsable) {
  const int W = world_group->size(), r = world_group->rank();
  const GPTConfig config = tiny();
  const std::string dir = offload_test_dir("plain");
  fsdp::models::TokenData data(fsdp::testing::make_token_file("offload-plain", 20000, config.vocab), config.context,
                               config.vocab);
  std::vector<double> losses[2];
  for (int offloaded = 0; offloaded < 2; ++offloaded) {
    auto options = block_units();
    if (offloaded) options.nvme_offload(offload_everything_to(dir));
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
      EXPECT_NE(error.find("nvme_offload trains through fsdp::TrainStep"), std::string::npos)
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

// The library's use of disk offload beyond the trainer's: between steps, an
// evaluation (a forward whose last gather reads the next unit ahead), then a
// change through a sharded state dict (written back to the scratch file),
// then training again. The offloaded model must compute what the in-memory
// one computes, bit for bit: a parameter read issued ahead of a write-back
// would hand the next gather the old values.
TEST(FullShard, DiskOffloadEqualsMemoryThroughEvaluationAndStateDictLoads) {
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
      if (offloaded) options.nvme_offload(offload_everything_to(dir));
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
      EXPECT_EQ(losses[1][i], losses[0][i]) << fsdp::dtype_name(dtype) << ": loss " << i << " (steps and evaluations)";
    }
  }
  world_group->barrier()->wait();
  if (r == 0) std::filesystem::remove_all(dir);
}

// ---- the gathers' order on a device (src/core/gather_order.h) ----

namespace {

// The MPI world, naming a stream of its own for all-gathers as NCCL's group
// does: on a CPU the order's decisions are made (and traced) though there
// are no events to wait on.
class GroupWithGatherStream final : public fsdp::ProcessGroup {
 public:
  explicit GroupWithGatherStream(fsdp::ProcessGroupPtr inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  fsdp::WorkHandle all_gather(torch::Tensor o, torch::Tensor i) override { return inner_->all_gather(o, i); }
  fsdp::WorkHandle reduce_scatter(torch::Tensor o, torch::Tensor i, fsdp::ReduceOp op) override {
    return inner_->reduce_scatter(o, i, op);
  }
  fsdp::WorkHandle all_reduce(torch::Tensor t, fsdp::ReduceOp op) override { return inner_->all_reduce(t, op); }
  fsdp::WorkHandle broadcast(torch::Tensor t, int root) override { return inner_->broadcast(t, root); }
  fsdp::WorkHandle barrier() override { return inner_->barrier(); }
  std::shared_ptr<fsdp::ProcessGroup> split(int c, int k) override {
    return std::make_shared<GroupWithGatherStream>(inner_->split(c, k));
  }
  std::shared_ptr<fsdp::ProcessGroup> split_shared_memory() override {
    return std::make_shared<GroupWithGatherStream>(inner_->split_shared_memory());
  }
  std::optional<c10::Stream> gather_stream() const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(torch::kCPU));
  }

 private:
  fsdp::ProcessGroupPtr inner_;
};

// The tiny GPT with 4 blocks, trained 2 steps over `group`: the losses.
std::vector<float> losses_over(const fsdp::ProcessGroupPtr& group) {
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  config.layers = 4;
  fsdp::models::TokenData data(fsdp::testing::make_token_file("gather-order", 20000, config.vocab), config.context,
                               config.vocab);
  auto model = fsdp::fully_shard(make_gpt(config), group, block_units());
  fsdp::FusedAdamW optimizer(model.parameters(), spec_adamw());
  std::vector<float> losses;
  for (int64_t step = 0; step < 2; ++step) {
    auto [x, y] = data.batch(step, 0, r, W, 1, 2);
    torch::Tensor loss = model.forward(x, y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<float>());
  }
  return losses;
}

}  // namespace

// FSDP2's order, visible on a CPU through the trace: the gather stream
// waits for the compute stream once per step (at the root's pre-forward,
// the backward continuing the pass), and a unit's gather waits only for the
// free of the unit two before it (so it overlaps the previous unit's
// compute), never the newest one held. Losses do not change.
TEST(GatherOrder, GathersWaitForTheComputeStreamOncePerPassAndOverlapThePreviousUnit) {
  const std::string trace_file = "/tmp/fsdp_test_gather_order." + std::to_string(::getpid()) + ".json";
  const std::vector<float> plain = losses_over(world_group);
  fsdp::trace::enable();
  fsdp::trace::complete("gather order test begins", "order-test", fsdp::trace::now_us());
  const std::vector<float> ordered = losses_over(std::make_shared<GroupWithGatherStream>(world_group));
  fsdp::trace::write(trace_file, world_group->rank());
  fsdp::trace::enable(false);
  std::ifstream trace_in(trace_file);
  const nlohmann::json trace = nlohmann::json::parse(trace_in);
  std::filesystem::remove(trace_file);
  EXPECT_EQ(ordered, plain) << "the gathers' order changed the numbers";

  std::vector<std::string> decisions;
  bool begun = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "order-test") begun = true;
    if (begun && e.value("cat", "") == "order") decisions.push_back(e["name"]);
  }
  ASSERT_FALSE(decisions.empty()) << "no gather-order decision traced";
  int compute_waits = 0, gathers = 0;
  std::vector<size_t> held;  // units whose buffers are held, oldest first
  std::vector<std::string> violations;
  std::set<std::string> forward_waits;
  int pass_gathers = 0;
  for (const std::string& d : decisions) {
    size_t a = 0, b = 0;
    if (d == "gather stream waits for the compute stream") {
      ++compute_waits;
      held.clear();  // the previous pass released them
      pass_gathers = 0;
    } else if (std::sscanf(d.c_str(), "hold unit %zu's buffer", &a) == 1) {
      held.push_back(a);
    } else if (std::sscanf(d.c_str(), "gather stream waits for the free of unit %zu, before unit %zu's gather", &a,
                           &b) == 2) {
      if (held.empty() || held.front() != a) violations.push_back(d + ": not the oldest held");
      if (held.size() < 2) violations.push_back(d + ": the newest held buffer was released");
      if (!held.empty()) held.erase(held.begin());
      if (pass_gathers < 5) forward_waits.insert(d);  // the forward's: root and 4 blocks first
    } else if (std::sscanf(d.c_str(), "gather of unit %zu on the gather stream", &a) == 1) {
      ++gathers;
      ++pass_gathers;
      if (held.size() > 1) violations.push_back(d + ": " + std::to_string(held.size()) + " buffers held");
    } else {
      violations.push_back("an unknown decision: " + d);
    }
  }
  EXPECT_TRUE(violations.empty()) << violations.front();
  EXPECT_EQ(compute_waits, 2) << "one wait for the compute stream per step (2 steps)";
  EXPECT_GE(gathers, 2 * 9) << "each step gathers 5 units in forward and 4 in backward";
  // Forward, units()[i + 1] = block i: block 2 waits for block 0's users,
  // block 3 for block 1's; the root and blocks 0, 1 for nothing but the pass.
  EXPECT_EQ(forward_waits, (std::set<std::string>{"gather stream waits for the free of unit 1, before unit 3's gather",
                                                  "gather stream waits for the free of unit 2, before unit 4's gather"}));
}
