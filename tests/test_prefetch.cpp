// Prefetch at W = 2, 3 and 4: the next unit gathered ahead within the
// limiter's bound, forward and backward (measured by the allocator); the
// gathers' order on a device (src/core/gather_order.h), through the trace of
// a group that names a gather stream.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "fsdp/token_data.h"
#include "fsdp/trace.h"
#include "probe_net.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "base/trace_events.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::memory::Category;
using fsdp::UnitState;
using fsdp::testing::world_group;
using fsdp::testing::ProbeBlockImpl;
using fsdp::testing::ProbeNet;
using fsdp::testing::block_units;
using fsdp::testing::kProbeWidth;
using fsdp::testing::make_gpt;
using fsdp::testing::probe_unit_bytes;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;

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
TEST(Prefetch, GathersTheNextUnitAheadWithinTheLimiter) {
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
      const auto& units = fsdp::detail::units(*state);  // units[0] is the root, units[i + 1] block i
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
  fsdp::WorkHandle all_to_all(torch::Tensor o, torch::Tensor i) override { return inner_->all_to_all(o, i); }
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
// compute), never the newest one held; a pass ends with the stream waiting
// for every buffer it releases. Losses do not change.
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
      if (!held.empty()) violations.push_back(d + ": a buffer of the previous pass still held");
      pass_gathers = 0;
    } else if (d.find(", at the end of the pass") != std::string::npos &&
               std::sscanf(d.c_str(), "gather stream waits for the free of unit %zu,", &a) == 1) {
      if (held.empty() || held.front() != a) violations.push_back(d + ": not the oldest held");
      if (!held.empty()) held.erase(held.begin());
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

// A forward with autograd on whose backward never comes leaves its pass
// open. What comes next between steps (here an UnshardScope with
// writeback; state dicts and checkpoints go through the same check_idle())
// ends it: the held buffers are released after the gather stream waited for
// their users, and the scope's gathers are not issued on the gather stream
// (they wait for the compute stream, which wrote the shards since).
TEST(GatherOrder, AForwardWithoutBackwardLeavesNoPassOpenForAnUnshardScope) {
  const std::string trace_file = "/tmp/fsdp_test_gather_order_open." + std::to_string(::getpid()) + ".json";
  const int W = world_group->size(), r = world_group->rank();
  GPTConfig config = tiny();
  fsdp::models::TokenData data(fsdp::testing::make_token_file("gather-order", 20000, config.vocab), config.context,
                               config.vocab);
  auto model = fsdp::fully_shard(make_gpt(config), std::make_shared<GroupWithGatherStream>(world_group), block_units());
  auto [x, y] = data.batch(0, 0, r, W, 1, 2);
  fsdp::trace::enable();
  fsdp::trace::complete("forward without backward", "order-test", fsdp::trace::now_us());
  (void)model.forward(x, y);  // autograd on, the loss dropped
  fsdp::trace::complete("scope", "order-test", fsdp::trace::now_us());
  { fsdp::UnshardScope scope(model.state(), /*writeback=*/true); }
  fsdp::trace::write(trace_file, world_group->rank());
  fsdp::trace::enable(false);
  std::ifstream trace_in(trace_file);
  const nlohmann::json trace = nlohmann::json::parse(trace_in);
  std::filesystem::remove(trace_file);
  std::string phase;
  std::vector<std::string> after_forward;  // the scope's decisions
  int still_held = 0;                      // by the forward's pass when it ended
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "order-test") phase = e["name"];
    if (e.value("cat", "") != "order" || phase.empty()) continue;
    const std::string d = e["name"];
    if (phase == "scope") {
      after_forward.push_back(d);
    } else if (d.rfind("hold unit", 0) == 0) {
      ++still_held;
    } else if (d.rfind("gather stream waits for the free of unit", 0) == 0) {
      --still_held;
    }
  }
  ASSERT_GT(still_held, 0) << "the forward's pass held no buffer at its end: nothing to check";
  // Exactly: the open pass's buffers released after a wait, and no gather on the gather stream.
  EXPECT_EQ(static_cast<int>(after_forward.size()), still_held) << ::testing::PrintToString(after_forward);
  for (const std::string& d : after_forward) {
    EXPECT_EQ(d.rfind("gather stream waits for the free of unit ", 0), 0u) << "the scope's decision: " << d;
    EXPECT_NE(d.find(", at the end of the pass"), std::string::npos) << "the scope's decision: " << d;
  }
}
