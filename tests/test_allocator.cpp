// The counting allocator (single process): live and peak bytes per
// category, host bytes from another allocator counted into theirs, and the
// block cache. The per-rank accounting of a sharded model is in
// test_memory.cpp.

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>

#include "fsdp/memory.h"
#include "base/memory_counters.h"

using fsdp::memory::Category;

TEST(Allocator, CountsLiveAndPeakBytesPerCategory) {
  using fsdp::memory::Category;
  ASSERT_TRUE(fsdp::memory::counting_allocator_installed());
  auto before = fsdp::memory::usage();
  fsdp::memory::reset_peaks();
  torch::Tensor shard;
  {
    fsdp::memory::MemoryCategoryScope scope(Category::kParameterShard);
    shard = torch::empty({1000}, torch::kFloat);
  }
  { torch::Tensor temp = torch::empty({500}, torch::kDouble); }
  auto after = fsdp::memory::usage();
  EXPECT_EQ(after.live(Category::kParameterShard) - before.live(Category::kParameterShard), 4000);
  EXPECT_EQ(after.live(Category::kOther), before.live(Category::kOther));
  EXPECT_GE(after.peak(Category::kOther) - before.live(Category::kOther), 4000);
  EXPECT_GE(after.peak_total - before.live_total, 8000);
  shard.reset();
  EXPECT_EQ(fsdp::memory::usage().live(Category::kParameterShard), before.live(Category::kParameterShard));
}

// Pinned host memory (CPU offload on a GPU) comes from CUDA's host
// allocator, which the counting allocator does not see: its owner counts it
// in, into its category (live, peak, the total), and out.
TEST(Allocator, CountsHostBytesFromAnotherAllocatorIntoTheirCategory) {
  using fsdp::memory::Category;
  const auto before = fsdp::memory::usage();
  fsdp::memory::reset_peaks();
  fsdp::memory::count_host_bytes(Category::kGradientShard, 1 << 20);
  const auto in = fsdp::memory::usage();
  EXPECT_EQ(in.live(Category::kGradientShard) - before.live(Category::kGradientShard), 1 << 20);
  EXPECT_EQ(in.live_total - before.live_total, 1 << 20);
  EXPECT_GE(in.peak(Category::kGradientShard) - before.live(Category::kGradientShard), 1 << 20);
  fsdp::memory::count_host_bytes(Category::kGradientShard, -(1 << 20));
  const auto out = fsdp::memory::usage();
  EXPECT_EQ(out.live(Category::kGradientShard), before.live(Category::kGradientShard));
  EXPECT_EQ(out.live_total, before.live_total);
}

// The block cache: a freed block of 1 MiB or more comes back to the next
// allocation of exactly its size (the same memory), counted as cached and not
// live; other sizes, small blocks and a full cache go back to malloc; the
// oldest block is dropped first; empty_block_cache() frees them all.
TEST(Allocator, TheBlockCacheReusesExactSizesWithinItsLimit) {
  using fsdp::memory::Category;
  namespace mem = fsdp::memory;
  const int64_t saved_limit = mem::block_cache_limit();
  mem::empty_block_cache();
  const int64_t MiB = 1 << 20;
  mem::set_block_cache_limit(5 * MiB);
  const mem::Usage start = mem::usage();
  ASSERT_EQ(start.cached_bytes, 0);

  void* first = nullptr;
  {
    mem::MemoryCategoryScope scope(Category::kUnshardedBuffer);
    torch::Tensor buffer = torch::empty({2 * MiB}, torch::kByte);
    first = buffer.data_ptr();
    EXPECT_EQ(mem::usage().live(Category::kUnshardedBuffer) - start.live(Category::kUnshardedBuffer), 2 * MiB);
  }
  EXPECT_EQ(mem::usage().cached_bytes, 2 * MiB) << "a freed 2 MiB block is kept";
  EXPECT_EQ(mem::usage().live(Category::kUnshardedBuffer), start.live(Category::kUnshardedBuffer)) << "cached is not live";
  {
    torch::Tensor other_size = torch::empty({2 * MiB + 64}, torch::kByte);
    EXPECT_NE(other_size.data_ptr(), first) << "only an exact size reuses a block";
    EXPECT_EQ(mem::usage().cached_bytes, 2 * MiB);
  }
  // The block of 2 MiB + 64 bytes joined the cache: 4 MiB + 64 of 5 MiB.
  EXPECT_EQ(mem::usage().cached_bytes, 4 * MiB + 64);
  {
    torch::Tensor again = torch::empty({2 * MiB}, torch::kByte);
    EXPECT_EQ(again.data_ptr(), first) << "the same size takes the cached block";
    EXPECT_EQ(mem::usage().cache_hits - start.cache_hits, 1);
    EXPECT_EQ(mem::usage().cached_bytes, 2 * MiB + 64);
    EXPECT_EQ(mem::usage().live_total - start.live_total, 2 * MiB);
  }
  { torch::Tensor small = torch::empty({MiB - 1}, torch::kByte); }
  EXPECT_EQ(mem::usage().cached_bytes, 4 * MiB + 64) << "blocks under 1 MiB are not cached";
  {
    // Freed last, it pushes the cache past 5 MiB: the oldest (2 MiB + 64) goes.
    torch::Tensor third = torch::empty({MiB}, torch::kByte);
  }
  EXPECT_EQ(mem::usage().cached_bytes, 3 * MiB);
  { torch::Tensor too_big = torch::empty({6 * MiB}, torch::kByte); }
  EXPECT_EQ(mem::usage().cached_bytes, 3 * MiB) << "a block over the limit is not cached";
  EXPECT_GE(mem::usage().peak_reserved, mem::usage().live_total + 3 * MiB);

  mem::set_block_cache_limit(MiB);
  EXPECT_EQ(mem::usage().cached_bytes, MiB) << "a lower limit drops the oldest blocks";
  mem::empty_block_cache();
  EXPECT_EQ(mem::usage().cached_bytes, 0);
  EXPECT_EQ(mem::block_cache_limit(), MiB) << "emptying keeps the limit";
  { torch::Tensor off = torch::empty({MiB}, torch::kByte); }
  mem::set_block_cache_limit(0);
  EXPECT_EQ(mem::usage().cached_bytes, 0) << "limit 0 turns the cache off";
  EXPECT_THROW(mem::set_block_cache_limit(-1), c10::Error);
  mem::set_block_cache_limit(saved_limit);
}

// The engine's own buffers of 1 MiB or more (every category but kOther) are
// pages of their own: page-aligned, so the disk offload moves them in place
// with O_DIRECT, and unmapped when freed past the cache, so no heap keeps
// them (glibc's would, under its 32 MiB mmap threshold). Counted to the byte
// as before.
TEST(Allocator, TheEnginesLargeBuffersArePagesOfTheirOwn) {
  namespace mem = fsdp::memory;
  const int64_t saved_limit = mem::block_cache_limit();
  mem::set_block_cache_limit(0);
  const int64_t bytes = (1 << 20) + 3;
  const mem::Usage start = mem::usage();
  for (Category category : {Category::kParameterShard, Category::kGradientShard, Category::kOptimizerState,
                            Category::kUnshardedBuffer, Category::kSecondaryPartition}) {
    void* data = nullptr;
    {
      mem::MemoryCategoryScope scope(category);
      torch::Tensor buffer = torch::empty({bytes}, torch::kByte);
      data = buffer.data_ptr();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 4096, 0u) << fsdp::enum_name(category);
      EXPECT_EQ(mem::usage().live(category) - start.live(category), bytes) << fsdp::enum_name(category);
      EXPECT_EQ(::msync(data, 4096, MS_ASYNC), 0) << "mapped while live";
    }
    EXPECT_EQ(::msync(data, 4096, MS_ASYNC), -1) << fsdp::enum_name(category) << ": still mapped once freed";
    EXPECT_EQ(errno, ENOMEM);
  }
  EXPECT_EQ(mem::usage().live_total, start.live_total);
  mem::set_block_cache_limit(saved_limit);
}
