// Devices, on 1, 2 and 4 ranks. On any machine: the device context on the
// host, an explicit device, NCCL refused without CUDA or a GPU. On a machine
// with a GPU (label gpu; skipped with the reason elsewhere): device tensors
// through the host-staged MPI collectives and through NCCL, FULL_SHARD on the
// GPU against the same training on the CPU, CPU offload on the GPU (and its
// device memory), and sharded checkpoints moving between GPU and CPU.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <filesystem>

#include "base/device_context.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "fsdp/token_data.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"

using fsdp::models::GPT;
using fsdp::models::GPTConfig;
using fsdp::testing::block_units;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::train_losses;
using fsdp::testing::world_group;

namespace {

bool has_gpu() { return fsdp::cuda_device_count() > 0; }

#define SKIP_WITHOUT_GPU()                                                                                      \
  if (!has_gpu()) {                                                                                             \
    GTEST_SKIP() << (fsdp::cuda_build() ? "no GPU visible to this process" : "a build without CUDA (FSDP_CUDA)"); \
  }

c10::Device gpu() { return c10::Device(torch::kCUDA, 0); }

}  // namespace

// The model's device context on the host: CPU offload there copies nothing,
// so no copy stream is made even when asked for, and asking for it is
// refused by name; waiting for its copies waits for nothing.
TEST(DeviceContext, OnTheHostThereIsNoCopyStream) {
  const fsdp::DeviceContext context(c10::Device(torch::kCPU), /*copy_stream=*/true);
  EXPECT_TRUE(context.on_host());
  EXPECT_FALSE(context.has_copy_stream());
  EXPECT_THROW(context.copy_stream(), c10::Error);
  context.synchronize_copy_stream();
  EXPECT_TRUE(fsdp::in_host_memory(torch::zeros({2})));
  EXPECT_TRUE(fsdp::is_host_device(c10::Device(torch::kCPU)));
}

// FullyShardOptions::device names where the units compute; naming the
// parameters' own device changes nothing.
TEST(Devices, AnExplicitDeviceTrainsAsTheParametersOwn) {
  EXPECT_EQ(train_losses(block_units().device(c10::Device(torch::kCPU)), 3, torch::kCPU),
            train_losses(block_units(), 3, torch::kCPU));
}

TEST(Devices, NcclIsRefusedWithWhatToDoWhereItCannotRun) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: NCCL can run here";
  try {
    fsdp::make_nccl_process_group(world_group, gpu());
    ADD_FAILURE() << "an NCCL group was made without a GPU";
  } catch (const c10::Error& e) {
    const std::string message = fsdp::error_message(e);
    EXPECT_NE(message.find(fsdp::cuda_build() ? "does not exist" : "CUDA configuration"), std::string::npos) << message;
  }
}

// ---- on a GPU ----

// The first thing scripts/gpu_check.sh asks of NCCL, right after the build
// (its "nccl" check): a communicator of this world made through the
// library (even of one rank, which fsdp-train would give a local group),
// one all-reduce and a barrier. Fails fast with NCCL's text where NCCL
// cannot run; skips where there is no GPU per rank.
TEST(NcclSmoke, OneAllReduceThroughTheLibrary) {
  SKIP_WITHOUT_GPU();
  if (world_group->size() > fsdp::cuda_device_count()) GTEST_SKIP() << "fewer GPUs than ranks: NCCL needs one each";
  const int W = world_group->size(), r = world_group->rank();
  const c10::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(r));
  const auto started = std::chrono::steady_clock::now();
  auto nccl = fsdp::make_nccl_process_group(world_group, device);
  torch::Tensor t = torch::full({1024}, static_cast<float>(r + 1), torch::TensorOptions().device(device));
  nccl->all_reduce(t, fsdp::ReduceOp::kSum)->wait();
  nccl->barrier()->wait();
  EXPECT_TRUE(torch::equal(t.cpu(), torch::full({1024}, static_cast<float>(W * (W + 1) / 2))));
  std::cout << "NCCL: a communicator of " << W << " rank(s), one all-reduce and a barrier in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s\n";
}

// A one-rank GPU run's group: collectives as device copies, no NCCL.
TEST(Gpu, ALocalGroupOnTheGpuTrainsAsTheCpu) {
  SKIP_WITHOUT_GPU();
  if (world_group->size() != 1) GTEST_SKIP() << "a group of one is what a one-rank run gets";
  const auto cpu = train_losses(block_units(), 4, torch::kCPU);
  const auto on_gpu = train_losses(block_units().device(gpu()), 4, gpu(), fsdp::make_local_process_group(gpu()));
  ASSERT_EQ(cpu.size(), on_gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(on_gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i;
}

// Device tensors through the MPI group: staged through host memory, the
// same results as host tensors (several ranks may share one GPU).
TEST(Gpu, StagedMpiCollectivesMatchHostOnes) {
  SKIP_WITHOUT_GPU();
  const int W = world_group->size(), r = world_group->rank();
  torch::Tensor mine = torch::arange(6, torch::kFloat) + 10 * r;
  torch::Tensor gathered = torch::empty({6 * W}, torch::TensorOptions().device(gpu()));
  world_group->all_gather(gathered, mine.to(gpu()))->wait();
  torch::Tensor expected = torch::empty({6 * W});
  world_group->all_gather(expected, mine)->wait();
  EXPECT_TRUE(torch::equal(gathered.cpu(), expected));
  torch::Tensor reduced = torch::empty({6}, torch::TensorOptions().device(gpu()));
  world_group->reduce_scatter(reduced, torch::arange(6 * W, torch::kFloat).to(gpu()), fsdp::ReduceOp::kAvg)->wait();
  EXPECT_TRUE(torch::allclose(reduced.cpu(), torch::arange(6 * W, torch::kFloat).narrow(0, 6 * r, 6)));
}

// NCCL needs a GPU per rank: at W = 1 on a one-GPU machine.
TEST(Gpu, NcclCollectivesMatchMpi) {
  SKIP_WITHOUT_GPU();
  if (world_group->size() > fsdp::cuda_device_count()) GTEST_SKIP() << "fewer GPUs than ranks";
  const int W = world_group->size(), r = world_group->rank();
  const c10::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(r));
  auto nccl = fsdp::make_nccl_process_group(world_group, device);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::Tensor input = (torch::arange(8 * W, torch::kFloat) * (r + 1)).to(dtype);
    torch::Tensor out = torch::empty({8}, torch::TensorOptions().dtype(dtype).device(device));
    nccl->reduce_scatter(out, input.to(device), fsdp::ReduceOp::kAvg)->wait();
    torch::Tensor expected = torch::empty({8}, dtype);
    world_group->reduce_scatter(expected, input, fsdp::ReduceOp::kAvg)->wait();
    EXPECT_TRUE(torch::allclose(out.cpu().to(torch::kFloat), expected.to(torch::kFloat), 1e-2)) << dtype;
    torch::Tensor gathered = torch::empty({8 * W}, torch::TensorOptions().dtype(dtype).device(device));
    nccl->all_gather(gathered, out)->wait();
    torch::Tensor host_gathered = torch::empty({8 * W}, dtype);
    world_group->all_gather(host_gathered, expected)->wait();
    EXPECT_TRUE(torch::allclose(gathered.cpu().to(torch::kFloat), host_gathered.to(torch::kFloat), 1e-2)) << dtype;
  }
  nccl->barrier()->wait();
}

// The engine on the GPU trains what it trains on the CPU: fp32, 1e-4
// relative on every step's loss (different kernels, the same math).
TEST(Gpu, FullShardOnTheGpuTrainsAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  const auto cpu = train_losses(block_units(), 6, torch::kCPU);
  const auto on_gpu = train_losses(block_units().device(gpu()), 6, gpu());
  ASSERT_EQ(cpu.size(), on_gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(on_gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i;
}

TEST(Gpu, CpuOffloadTrainsAsWithoutAndHoldsLessDeviceMemory) {
  SKIP_WITHOUT_GPU();
  fsdp::memory::reset_device_peaks(gpu());
  const auto plain = train_losses(block_units().device(gpu()), 4, gpu());
  const int64_t plain_peak = fsdp::memory::device_usage(gpu()).peak_allocated;
  torch::cuda::synchronize();
  fsdp::memory::reset_device_peaks(gpu());
  const auto offloaded = train_losses(block_units().device(gpu()).offload(fsdp::OffloadPolicy::cpu()), 4, gpu());
  const int64_t offload_peak = fsdp::memory::device_usage(gpu()).peak_allocated;
  // The offloaded shards step with FusedAdamW on the CPU, the others with
  // AdamW's CUDA kernels: another formula's rounding.
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(offloaded[i], plain[i], 1e-4 * std::abs(plain[i]));
  EXPECT_LT(offload_peak, plain_peak);
  std::cout << "device peak: " << plain_peak << " B without offload, " << offload_peak << " B with\n";
}

// A sharded checkpoint written by a GPU run loads into a CPU run, and back.
TEST(Gpu, ShardedCheckpointsMoveBetweenGpuAndCpu) {
  SKIP_WITHOUT_GPU();
  const std::string dir = "/tmp/fsdp_test_gpu_ckpt";
  auto on_gpu = fsdp::fully_shard(make_gpt(tiny(), 3), world_group, block_units().device(gpu()));
  torch::optim::AdamW gpu_optimizer(on_gpu.parameters(), spec_adamw());
  torch::Tensor x = torch::randint(tiny().vocab, {2, tiny().context}, torch::kLong);
  on_gpu.forward(x.to(gpu()), x.to(gpu())).backward();
  gpu_optimizer.step();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  const std::string saved = fsdp::save_checkpoint(on_gpu.state(), gpu_optimizer, dir, 1);
  auto on_cpu = fsdp::fully_shard(make_gpt(tiny(), 4), world_group, block_units());
  torch::optim::AdamW cpu_optimizer(on_cpu.parameters(), spec_adamw());
  fsdp::load_checkpoint(on_cpu.state(), cpu_optimizer, saved);
  const auto a = on_gpu.parameters(), b = on_cpu.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].detach().cpu(), b[i].detach())) << "unit " << i;
}
