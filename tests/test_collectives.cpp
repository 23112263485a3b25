// The MPI process group: whole outputs for padded buffers whose real size
// does not divide by the ranks, every dtype path, all-to-all's blocks,
// asynchrony (a collective
// stays in flight while a rank has not joined), sub-groups, byte counters,
// and mismatched calls failing on every rank. The group of one (what a
// one-GPU run gets instead of NCCL) against a one-rank MPI group, and the
// collective watchdog of device groups driven through injected failures.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/collective_watchdog.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "mpi_test_env.h"

using fsdp::ReduceOp;
using fsdp::testing::world_group;

namespace {

int64_t padded_shard(int64_t numel, int world) { return (numel + world - 1) / world; }

// Rank r's contribution: distinct per rank and element, exact in float.
torch::Tensor rank_values(int rank, int64_t n, torch::ScalarType type = torch::kFloat) {
  return (torch::arange(n, torch::kDouble) + 1000.0 * rank).to(type);
}

}  // namespace

TEST(Collectives, AllGatherUnevenSizesWithPadding) {
  const int W = world_group->size(), r = world_group->rank();
  for (int64_t numel : {1, 7, 10, 1023}) {  // none a multiple of 4, some below W
    const int64_t shard = padded_shard(numel, W);
    // Every rank's slice of the same padded flat vector [0, 1, ..., numel-1, 0...].
    torch::Tensor flat = torch::zeros({shard * W});
    flat.narrow(0, 0, numel).copy_(torch::arange(numel, torch::kFloat));
    torch::Tensor input = flat.narrow(0, r * shard, shard).clone();
    torch::Tensor output = torch::full({shard * W}, -1.0f);
    world_group->all_gather(output, input)->wait();
    EXPECT_TRUE(torch::equal(output, flat)) << "numel " << numel;
  }
}

TEST(Collectives, ReduceScatterSumAndAverage) {
  const int W = world_group->size(), r = world_group->rank();
  for (int64_t numel : {3, 10, 1001}) {
    const int64_t shard = padded_shard(numel, W);
    torch::Tensor input = torch::zeros({shard * W}, torch::kDouble);
    input.narrow(0, 0, numel).copy_(rank_values(r, numel, torch::kDouble));
    torch::Tensor expected_full = torch::zeros({shard * W}, torch::kDouble);
    for (int q = 0; q < W; ++q) expected_full.narrow(0, 0, numel).add_(rank_values(q, numel, torch::kDouble));
    torch::Tensor expected = expected_full.narrow(0, r * shard, shard);

    torch::Tensor sum = torch::empty({shard}, torch::kDouble);
    world_group->reduce_scatter(sum, input, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(sum, expected)) << "numel " << numel;

    // The sums are of integers, exact in double: the average is the same division.
    torch::Tensor avg = torch::empty({shard}, torch::kDouble);
    world_group->reduce_scatter(avg, input, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(torch::equal(avg, expected / W)) << "numel " << numel;
    // The expected slices hold the padding's zeros: the padding reduces to exactly zero.
  }
}

TEST(Collectives, AllReduceBroadcastAndHalfTypes) {
  const int W = world_group->size(), r = world_group->rank();
  for (auto type : {torch::kFloat, torch::kDouble, torch::kLong, torch::kBFloat16, torch::kHalf}) {
    // Element i of rank q is q + 1 + i: sums of small integers, exact in every type.
    torch::Tensor t = (torch::arange(5) + r + 1).to(type);
    world_group->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(t, (torch::arange(5) * W + W * (W + 1) / 2).to(type))) << type << ": " << t;
  }
  // (W - 1) / 2 is exact in float for any W.
  torch::Tensor avg = torch::full({3}, static_cast<double>(r));
  world_group->all_reduce(avg, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(torch::equal(avg, torch::full({3}, (W - 1) / 2.0))) << avg;

  torch::Tensor b = rank_values(r, 9);
  world_group->broadcast(b, W - 1)->wait();
  EXPECT_TRUE(torch::equal(b, rank_values(W - 1, 9)));

  torch::Tensor gathered = torch::empty({4 * W}, torch::kBFloat16);
  world_group->all_gather(gathered, rank_values(r, 4, torch::kBFloat16))->wait();
  std::vector<torch::Tensor> expected;
  for (int q = 0; q < W; ++q) expected.push_back(rank_values(q, 4, torch::kBFloat16));
  EXPECT_TRUE(torch::equal(gathered, torch::cat(expected)));
}

// Eight gathers issued before any is waited for: each completes with its
// own whole result (they run in issue order on the communication thread).
TEST(Collectives, ManyCollectivesInFlightEachCompleteWithItsOwnResult) {
  const int W = world_group->size(), r = world_group->rank();
  std::vector<fsdp::WorkHandle> works;
  std::vector<torch::Tensor> outs;
  for (int i = 0; i < 8; ++i) {
    outs.push_back(torch::empty({W * 1000}));
    works.push_back(world_group->all_gather(outs.back(), rank_values(r, 1000) + 10000.0 * i));
  }
  for (int i = 0; i < 8; ++i) {
    works[i]->wait();
    EXPECT_TRUE(works[i]->is_completed());
    std::vector<torch::Tensor> expected;
    for (int q = 0; q < W; ++q) expected.push_back(rank_values(q, 1000) + 10000.0 * i);
    EXPECT_TRUE(torch::equal(outs[i], torch::cat(expected))) << "gather " << i;
  }
}

// Asynchrony itself: the call returns with the collective still in flight.
// The last rank joins 500 ms late, so on every other rank the Work cannot be
// complete straight after the call (checked long before that rank joins)
// unless the call waited for it; it completes once wait() returns.
TEST(Collectives, ACollectiveIsInFlightUntilTheLastRankJoins) {
  const int W = world_group->size(), r = world_group->rank();
  const bool late = r == W - 1;
  torch::Tensor output = torch::empty({3 * W});
  world_group->barrier()->wait();  // the ranks leave it together
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  fsdp::WorkHandle work = world_group->all_gather(output, rank_values(r, 3));
  const bool completed_at_once = work->is_completed();
  if (!late)
    EXPECT_FALSE(completed_at_once) << "the all_gather was complete when the call returned, though rank " << W - 1
                                    << " joins it 500 ms late: the call waited for it";
  work->wait();
  EXPECT_TRUE(work->is_completed());
  std::vector<torch::Tensor> expected;
  for (int q = 0; q < W; ++q) expected.push_back(rank_values(q, 3));
  EXPECT_TRUE(torch::equal(output, torch::cat(expected)));
}

// Rank r's input is W blocks; block j goes to rank j, and output block i is
// what rank i sent to r. Values name the sender, the receiver and the
// element, small enough to be exact in int8.
TEST(Collectives, AllToAllSendsBlockJToRankJ) {
  const int W = world_group->size(), r = world_group->rank();
  auto value = [](int from, int to, int64_t k) { return static_cast<double>(from * 24 + to * 5 + k % 5); };
  for (auto type : {torch::kFloat, torch::kChar, torch::kDouble, torch::kBFloat16}) {
    for (int64_t block : {1, 7, 1000}) {
      torch::Tensor input = torch::empty({W * block}, torch::kDouble);
      torch::Tensor expected = torch::empty({W * block}, torch::kDouble);
      for (int j = 0; j < W; ++j) {
        for (int64_t k = 0; k < block; ++k) {
          input[j * block + k] = value(r, j, k);
          expected[j * block + k] = value(j, r, k);
        }
      }
      torch::Tensor output = torch::full({W * block}, -1, type);
      world_group->all_to_all(output, input.to(type))->wait();
      EXPECT_TRUE(torch::equal(output, expected.to(type))) << type << ", " << block << " per block: " << output;
    }
  }
}

TEST(Collectives, SubGroups) {
  const int W = world_group->size(), r = world_group->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  // Two "nodes": even and odd ranks.
  auto node = world_group->split(r % 2, r);
  EXPECT_EQ(node->size(), (W + 1 - r % 2) / 2);
  EXPECT_EQ(node->rank(), r / 2);
  torch::Tensor t = torch::full({2}, static_cast<double>(r));
  node->all_reduce(t, ReduceOp::kSum)->wait();
  double expected = 0;
  for (int q = r % 2; q < W; q += 2) expected += q;
  EXPECT_TRUE(torch::equal(t, torch::full({2}, expected))) << t;
}

TEST(Collectives, CountsBytesPerKind) {
  const int W = world_group->size();
  auto group = world_group->split(0, world_group->rank());  // fresh counters
  group->all_gather(torch::empty({3 * W}), torch::zeros({3}))->wait();
  group->reduce_scatter(torch::empty({5}), torch::zeros({5 * W}), ReduceOp::kAvg)->wait();
  group->all_reduce(torch::zeros({7}, torch::kDouble), ReduceOp::kSum)->wait();
  group->all_to_all(torch::empty({2 * W}, torch::kChar), torch::zeros({2 * W}, torch::kChar))->wait();
  auto stats = group->stats();
  EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllGather)], 3 * W * 4);
  EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kReduceScatter)], 5 * W * 4);
  EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllReduce)], 7 * 8);
  EXPECT_EQ(stats.bytes[static_cast<int>(fsdp::CollectiveKind::kAllToAll)], 2 * W);  // the input, int8
  EXPECT_EQ(stats.calls[static_cast<int>(fsdp::CollectiveKind::kAllGather)], 1);
  EXPECT_EQ(stats.calls[static_cast<int>(fsdp::CollectiveKind::kAllToAll)], 1);
}

TEST(Collectives, MismatchedSizesFailOnEveryRank) {
  const int W = world_group->size(), r = world_group->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 0 gathers 4 elements per rank, the others 5: every rank must throw,
  // naming both calls, and the group must stay usable afterwards.
  const int64_t n = r == 0 ? 4 : 5;
  try {
    world_group->all_gather(torch::empty({n * W}), torch::zeros({n}))->wait();
    ADD_FAILURE() << "a mismatched all_gather did not throw";
  } catch (const std::exception& e) {
    std::string msg = fsdp::error_message(e);
    EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0: all_gather(Float, 4 elements per rank)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1: all_gather(Float, 5 elements per rank)"), std::string::npos) << msg;
  }
  // Different dtypes.
  torch::Tensor t = r == 0 ? torch::zeros({4}, torch::kFloat) : torch::zeros({4}, torch::kDouble);
  EXPECT_THROW(world_group->all_reduce(t, ReduceOp::kSum)->wait(), c10::Error);
  // Different kinds of collective.
  if (r == 0) {
    EXPECT_THROW(world_group->broadcast(torch::zeros({4}), 0)->wait(), c10::Error);
  } else {
    EXPECT_THROW(world_group->all_reduce(torch::zeros({4}), ReduceOp::kSum)->wait(), c10::Error);
  }
  torch::Tensor ok = torch::ones({2});
  world_group->all_reduce(ok, ReduceOp::kSum)->wait();
  EXPECT_TRUE(torch::equal(ok, torch::full({2}, static_cast<float>(W)))) << ok;
}

TEST(Collectives, LocalMisuseIsRefusedBeforeAnyCommunication) {
  const int W = world_group->size();
  EXPECT_THROW(world_group->all_gather(torch::empty({W * 3 + 1}), torch::zeros({3})), c10::Error);
  EXPECT_THROW(world_group->reduce_scatter(torch::empty({3}), torch::zeros({3 * W}, torch::kLong), ReduceOp::kAvg),
               c10::Error);
  EXPECT_THROW(world_group->broadcast(torch::zeros({2}), W), c10::Error);
  auto refused = [](auto call, const std::string& expected) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error containing '" << expected << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(fsdp::error_message(e).find(expected), std::string::npos) << fsdp::error_message(e);
    }
  };
  refused([&] { world_group->all_to_all(torch::empty({3 * W + 1}), torch::zeros({3 * W + 1})); },
          "a multiple of " + std::to_string(W) + "; found " + std::to_string(3 * W + 1));
  refused([&] { world_group->all_to_all(torch::empty({2 * W}), torch::zeros({3 * W})); },
          "as many elements as input (" + std::to_string(3 * W) + "), found " + std::to_string(2 * W));
  refused([&] { world_group->all_to_all(torch::empty({W}, torch::kChar), torch::zeros({W})); },
          "output dtype Char differs from input dtype Float");
  torch::Tensor both = torch::zeros({2 * W});
  refused([&] { world_group->all_to_all(both, both); }, "must not overlap");
  refused([&] { world_group->all_to_all(torch::empty({2 * W}), torch::zeros({2, W}).t()); }, "must be contiguous");
  // Still in step: nothing refused reached the other ranks.
  torch::Tensor ok = torch::ones({2});
  world_group->all_reduce(ok, ReduceOp::kSum)->wait();
  EXPECT_TRUE(torch::equal(ok, torch::full({2}, static_cast<float>(W)))) << ok;
}

// ---- the group of one ----

// Every collective of a group of one is what a one-rank MPI group computes,
// and counts the same bytes and calls.
TEST(LocalGroup, CollectivesEqualAOneRankMpiGroupsAndCountTheSame) {
  const int r = world_group->rank();
  fsdp::ProcessGroupPtr mpi_one = world_group->split(r, 0), local = fsdp::make_local_process_group(torch::kCPU);
  ASSERT_EQ(mpi_one->size(), 1);
  EXPECT_EQ(local->size(), 1);
  EXPECT_EQ(local->rank(), 0);
  EXPECT_FALSE(local->gather_stream().has_value());
  std::vector<torch::Tensor> results[2];
  int i = 0;
  for (const auto& group : {mpi_one, local}) {
    torch::Tensor input = rank_values(r, 10), gathered = torch::full({10}, -1.0f), reduced = torch::full({10}, -1.0f);
    group->all_gather(gathered, input)->wait();
    group->reduce_scatter(reduced, rank_values(r, 10) * 3, ReduceOp::kAvg)->wait();
    torch::Tensor summed = rank_values(r, 4, torch::kBFloat16);
    group->all_reduce(summed, ReduceOp::kSum)->wait();
    torch::Tensor broadcast = rank_values(r, 3, torch::kLong);
    group->broadcast(broadcast, 0)->wait();
    // A gather in place: the input is the output's only slice.
    torch::Tensor in_place = rank_values(r, 6);
    group->all_gather(in_place, in_place.narrow(0, 0, 6))->wait();
    torch::Tensor exchanged = torch::full({5}, -1, torch::kChar);
    group->all_to_all(exchanged, (torch::arange(5) + r).to(torch::kChar))->wait();
    group->barrier()->wait();
    results[i++] = {gathered, reduced, summed, broadcast, in_place, exchanged};
  }
  for (size_t k = 0; k < results[0].size(); ++k) EXPECT_TRUE(torch::equal(results[0][k], results[1][k])) << k;
  const fsdp::CommStats a = mpi_one->stats(), b = local->stats();
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(local->split(0, 0)->size(), 1);
  EXPECT_EQ(local->split_shared_memory()->size(), 1);
}

TEST(LocalGroup, RefusesWhatNoGroupOfOneCanDo) {
  auto local = fsdp::make_local_process_group(torch::kCPU);
  auto refused = [&](auto call, const std::string& expected) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error containing '" << expected << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(fsdp::error_message(e).find(expected), std::string::npos) << fsdp::error_message(e);
    }
  };
  refused([&] { local->all_gather(torch::empty({8}), torch::ones({4})); }, "as many output elements as input (4)");
  refused([&] { local->broadcast(torch::ones({2}), 1); }, "root 1 is not a rank of a group of size 1");
  refused([&] { local->all_reduce(torch::ones({2}, torch::kLong), ReduceOp::kAvg); }, "floating-point");
  refused([&] { local->reduce_scatter(torch::empty({4}), torch::ones({4}, torch::kDouble), ReduceOp::kSum); },
          "differs from input dtype");
  refused([&] { local->all_to_all(torch::empty({3}), torch::ones({4})); }, "as many elements as input (4), found 3");
  torch::Tensor both = torch::ones({4});
  refused([&] { local->all_to_all(both, both); }, "must not overlap");
}

// ---- the collective watchdog (NCCL's, without CUDA: failures injected) ----

namespace {

// What the watchdog saw fail, and when.
struct Ended {
  std::mutex mutex;
  std::string message;
  std::atomic<int> calls{0};
  void operator()(const std::string& m) {
    std::lock_guard<std::mutex> lock(mutex);
    message = m;
    ++calls;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex);
    return message;
  }
};

// Waits up to `seconds` for `done`.
template <class Done>
bool within(double seconds, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

using Progress = fsdp::CollectiveProgress;

}  // namespace

// Healthy: collectives that finish leave the watchdog's queue in issue
// order, and it ends nothing.
TEST(CollectiveWatchdog, StaysQuietWhileCollectivesFinish) {
  Ended ended;
  std::atomic<bool> first_done{false}, second_done{false};
  {
    fsdp::CollectiveWatchdog watchdog([] { return std::string(); }, [&](const std::string& m) { ended(m); },
                                      std::chrono::milliseconds(5));
    watchdog.track("all_gather #0", [&] { return Progress{first_done ? Progress::State::kDone : Progress::State::kRunning, ""}; }, 60);
    watchdog.track("reduce_scatter #1", [&] { return Progress{second_done ? Progress::State::kDone : Progress::State::kRunning, ""}; }, 60);
    second_done = true;  // the later one alone finished: the earlier holds the queue
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(watchdog.in_flight(), 2u);
    first_done = true;
    EXPECT_TRUE(within(5, [&] { return watchdog.in_flight() == 0; }));
  }
  EXPECT_EQ(ended.calls, 0);
}

// NCCL reports a failed peer or link as the communicator's asynchronous
// error, long before any timeout: the watchdog ends the job with its text
// and the collective it interrupted, within a few polls.
TEST(CollectiveWatchdog, EndsTheJobWithTheCommunicatorsAsyncError) {
  Ended ended;
  std::atomic<bool> inject{false};
  fsdp::CollectiveWatchdog watchdog(
      [&] { return inject ? std::string("remote process exited or there was a network error (injected)") : std::string(); },
      [&](const std::string& m) { ended(m); }, std::chrono::milliseconds(5));
  watchdog.track("all_gather (call #7 of an NCCL group of 2 ranks, this rank 0)",
                 [] { return Progress{Progress::State::kRunning, ""}; }, 600);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(ended.calls, 0) << "ended a healthy job: " << ended.text();
  const auto injected_at = std::chrono::steady_clock::now();
  inject = true;
  ASSERT_TRUE(within(5, [&] { return ended.calls > 0; })) << "the injected error did not end the job";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - injected_at).count(), 3.0)
      << "a 5 ms poll took seconds to see the error";
  const std::string message = ended.text();
  EXPECT_NE(message.find("the communicator failed: remote process exited or there was a network error (injected)"),
            std::string::npos) << message;
  EXPECT_NE(message.find("while all_gather (call #7"), std::string::npos) << message;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(ended.calls, 1) << "the job is ended once";
}

// A collective whose device reports an error, and one past its timeout,
// end the job naming it.
TEST(CollectiveWatchdog, NamesAFailedCollectiveAndOnePastItsTimeout) {
  {
    Ended ended;
    fsdp::CollectiveWatchdog watchdog([] { return std::string(); }, [&](const std::string& m) { ended(m); },
                                      std::chrono::milliseconds(5));
    watchdog.track("broadcast #3", [] { return Progress{Progress::State::kFailed, "an illegal memory access (injected)"}; }, 600);
    ASSERT_TRUE(within(5, [&] { return ended.calls > 0; }));
    EXPECT_NE(ended.text().find("broadcast #3 failed on the device: an illegal memory access (injected)"),
              std::string::npos) << ended.text();
  }
  {
    Ended ended;
    fsdp::CollectiveWatchdog watchdog([] { return std::string(); }, [&](const std::string& m) { ended(m); },
                                      std::chrono::milliseconds(5));
    const auto tracked_at = std::chrono::steady_clock::now();
    watchdog.track("all_reduce #9", [] { return Progress{Progress::State::kRunning, ""}; }, 1.5);
    ASSERT_TRUE(within(10, [&] { return ended.calls > 0; }));
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - tracked_at).count(), 1.5)
        << "ended before the timeout";
    EXPECT_NE(ended.text().find("all_reduce #9 did not complete within 1.5 s"), std::string::npos) << ended.text();
  }
}
