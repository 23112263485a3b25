// main() for multi-rank GoogleTest binaries: MPI lives for the whole run,
// every rank runs every test, and only rank 0 prints GoogleTest's report
// (a failure on any rank still fails the process, and so the ctest test).

#include <gtest/gtest.h>

#include "fsdp/memory.h"
#include "mpi_test_env.h"

#include <cstdlib>
#include <iostream>
#include <string>

namespace fsdp::testing {
ProcessGroupPtr world_group;
}

namespace {
// On ranks other than 0, GoogleTest's report is replaced by this: failures
// only, each tagged with its rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": failure\n" << result.summary() << "\n" << std::flush;
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  // GPU-only test runs (FSDP_TEST_NEEDS_GPU=1) on a machine without one:
  // the reason, and 77, which ctest reports as skipped.
  // Counted first, before any test seeds: on a machine with a GPU this loads
  // the CUDA module, which must come before anything asks LibTorch about CUDA
  // (src/comm/cuda_module.h).
  const int gpus = fsdp::cuda_device_count();
  if (const char* needs = std::getenv("FSDP_TEST_NEEDS_GPU"); needs && std::string(needs) == "1" && gpus == 0) {
    std::cout << "skipped: " << (fsdp::cuda_build() ? "no GPU visible to this process" : "a build without CUDA (FSDP_CUDA)")
              << "\n";
    return 77;
  }
  fsdp::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  fsdp::MpiEnvironment mpi(&argc, &argv);
  fsdp::testing::world_group = mpi.world();
  if (mpi.world()->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(mpi.world()->rank()));
  }
  int result = RUN_ALL_TESTS();
  // Every rank must leave with the same verdict: one rank's failure fails all.
  torch::Tensor failed = torch::tensor({result != 0 ? 1 : 0}, torch::kInt);
  fsdp::testing::world_group->all_reduce(failed, fsdp::ReduceOp::kSum)->wait();
  fsdp::testing::world_group.reset();
  return failed.item<int>() > 0 ? 1 : 0;
}
