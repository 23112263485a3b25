// Activation checkpointing at W = 2, 3 and 4: one full gradient buffer alive
// at a time (measured by the allocator in backward), and a checkpointed unit
// fed raw data still getting its gradients.

#include <gtest/gtest.h>

#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "probe_net.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"

using fsdp::memory::Category;
using fsdp::testing::world_group;
using fsdp::testing::ProbeBlockImpl;
using fsdp::testing::ProbeNet;
using fsdp::testing::expect_gradients_match;
using fsdp::testing::kProbeWidth;
using fsdp::testing::probe_unit_bytes;

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
TEST(ActivationCheckpointing, KeepsOneFullGradientAliveAtATime) {
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
TEST(ActivationCheckpointing, ACheckpointedUnitFedDataGetsItsGradients) {
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
