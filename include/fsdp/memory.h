#pragma once
// Exact tensor-memory accounting: a counting allocator in front of LibTorch's
// CPU allocator. Every CPU tensor allocation is attributed to the category
// that is current on the allocating thread (MemoryCategoryScope), and live and
// peak bytes are kept per category.

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <string>

namespace fsdp::memory {

enum class Category {
  kParameterShard,   // the local fp32 shards that the optimizer steps
  kGradientShard,    // the gradients of those shards
  kOptimizerState,   // what the optimizer allocates while stepping (Adam moments)
  kUnshardedBuffer,  // all-gathered parameters and unsharded gradients, transient
  kOther,            // activations, temporaries, everything else
  kCount
};
constexpr size_t kNumCategories = static_cast<size_t>(Category::kCount);
const char* category_name(Category c);

struct Usage {
  std::array<int64_t, kNumCategories> live_bytes{};
  std::array<int64_t, kNumCategories> peak_bytes{};  // each category's own peak
  int64_t live_total = 0;
  int64_t peak_total = 0;  // peak of the sum (not the sum of the peaks)
  // Freed blocks kept for reuse (set_block_cache_limit), and the peak of
  // live + cached: the tensor memory the process holds, as the CUDA caching
  // allocator's "reserved" is to its "allocated".
  int64_t cached_bytes = 0;
  int64_t peak_reserved = 0;
  int64_t cache_hits = 0;  // allocations served from the cache, ever
  int64_t live(Category c) const { return live_bytes[static_cast<size_t>(c)]; }
  int64_t peak(Category c) const { return peak_bytes[static_cast<size_t>(c)]; }
  // Parameter shards + gradient shards + optimizer state, live now.
  int64_t model_state() const;
};

// Installs the counting allocator (idempotent). Tensors allocated before this
// call are not counted; call it first thing in main().
void install_counting_allocator();
bool counting_allocator_installed();

Usage usage();
// Starts a new peak window: every peak is set to the current live value.
void reset_peaks();

// The block cache: freed CPU blocks of 1 MiB or more are kept, up to `bytes`
// in all (the oldest dropped first), and handed to the next allocation of
// exactly their size. FSDP frees and re-gathers the same buffer sizes over
// and over; without the cache each one comes back from the kernel as fresh
// pages to fault in and zero (on `large` that was a fifth of the step). Off
// (0) until set; counted as cached, not live, so the categories stay exact.
void set_block_cache_limit(int64_t bytes);
int64_t block_cache_limit();
void empty_block_cache();  // frees every cached block; the limit stays

// The units' gathered parameter buffers (FlatParam's unsharded buffers,
// filled before each use and freed after), on whatever device they are:
// bytes live now and at their peak since reset_peaks(), counted exactly where
// fsdp-cpp fills and frees them. On a GPU this is the split of transient
// device memory beside the CUDA caching allocator's totals, which cannot be
// split by category the way the counting allocator splits host memory.
struct GatheredUsage {
  int64_t live = 0, peak = 0;
};
GatheredUsage gathered_usage();
// Host memory from another allocator than the CPU's, which the counting
// allocator cannot see (pinned blocks, from CUDA's host allocator, for CPU
// offload on a GPU): its owner counts `delta` bytes into (+) or out of (-)
// `category` as it allocates and frees them. Ignored without the counting
// allocator.
void count_host_bytes(Category category, int64_t delta);
void count_gathered_bytes(int64_t delta);  // FlatParam's, as it fills (+) and frees (-) a buffer

// A GPU's memory as the CUDA caching allocator sees it (every tensor on the
// device, ours and the model's; the categories above count host memory):
// bytes in live tensors and reserved from the driver, now and at their peak
// since the last reset_device_peaks(). Zeros for a CPU device and in builds
// without CUDA.
struct DeviceUsage {
  int64_t allocated = 0, peak_allocated = 0;
  int64_t reserved = 0, peak_reserved = 0;
};
DeviceUsage device_usage(c10::Device device);
void reset_device_peaks(c10::Device device);

// Attributes the allocations made on this thread while it lives.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(Category category);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  Category previous_;
};

// Deferred initialization (the C++ counterpart of building a model on
// PyTorch's meta device): while a DeferredInit lives, CPU allocations on
// this thread take no memory of their own. They all share one lazily
// committed scratch region, so a model's constructor can run (and write its
// throwaway initial values) using only as much memory as its largest single
// tensor. Such "deferred" tensors have the right shapes but no values;
// fully_shard() with FullyShardOptions::param_init_fn materializes and
// initializes the parameters one unit at a time, sharding each unit before
// the next is built. Buffers must not be created in a deferred constructor
// (they would keep no values). Needs the counting allocator.
class DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();  // gives the scratch region's memory back
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
};
// Whether a data pointer belongs to a deferred tensor.
bool is_deferred(const void* data);

}  // namespace fsdp::memory
