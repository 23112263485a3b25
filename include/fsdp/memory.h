#pragma once
/// \file
/// Exact tensor-memory accounting: a counting allocator in front of LibTorch's
/// CPU allocator. Every CPU tensor allocation is attributed to the category
/// that is current on the allocating thread (MemoryCategoryScope), and live and
/// peak bytes are kept per category. The engine's own buffers (every category
/// but kOther) of 1 MiB or more are pages of their own: page-aligned, so the
/// disk offload moves them with O_DIRECT in place, and returned to the
/// kernel when freed past the block cache (set_block_cache_limit).

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <string>
#include "fsdp/enum_names.h"

namespace fsdp::memory {

/// What an allocation is for: every counted byte is in exactly one.
/// Named by enum_name, parsed by parse_enum (for reports): "parameter_shards", "gradient_shards",
/// "optimizer_state", "unsharded_buffers", "secondary_partition", "other".
enum class Category {
  kParameterShard,   ///< the local fp32 shards that the optimizer steps
  kGradientShard,    ///< the gradients of those shards
  kOptimizerState,   ///< what the optimizer allocates while stepping (Adam moments)
  kUnshardedBuffer,  ///< all-gathered parameters and unsharded gradients, transient
  kSecondaryPartition,  ///< ZeroPlusPlus::secondary_partition: the host's slices kept from forward to backward
  kOther,            ///< activations, temporaries, everything else
  kCount             ///< the number of categories, not a category
};
/// The number of categories (the size of Usage's arrays).
constexpr size_t kNumCategories = static_cast<size_t>(Category::kCount);
}  // namespace fsdp::memory
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<memory::Category>);  ///< for reports: "parameter_shards", "gradient_shards", ...
}  // namespace fsdp::detail
namespace fsdp::memory {

/// The counting allocator's figures (usage()): live and peak bytes, by category and in all.
struct Usage {
  std::array<int64_t, kNumCategories> live_bytes{};  ///< each category's bytes now
  std::array<int64_t, kNumCategories> peak_bytes{};  ///< each category's own peak
  int64_t live_total = 0;  ///< every category's bytes now
  int64_t peak_total = 0;  ///< peak of the sum (not the sum of the peaks)
  /// Freed blocks kept for reuse (set_block_cache_limit), and the peak of
  /// live + cached: the tensor memory the process holds, as the CUDA caching
  /// allocator's "reserved" is to its "allocated".
  ///@{
  int64_t cached_bytes = 0;
  int64_t peak_reserved = 0;
  ///@}
  int64_t cache_hits = 0;  ///< allocations served from the cache, ever
  /// Category `c`'s bytes now.
  int64_t live(Category c) const { return live_bytes[static_cast<size_t>(c)]; }
  /// Category `c`'s own peak.
  int64_t peak(Category c) const { return peak_bytes[static_cast<size_t>(c)]; }
  /// Parameter shards + gradient shards + optimizer state, live now.
  int64_t model_state() const;
};

/// Installs the counting allocator (idempotent). Tensors allocated before this
/// call are not counted; call it first thing in main().
void install_counting_allocator();

/// The figures now (this process's CPU tensors since the allocator was installed).
Usage usage();
/// Starts a new peak window: every peak is set to the current live value.
void reset_peaks();

/// The block cache: freed CPU blocks of 1 MiB or more are kept, up to `bytes`
/// in all (the oldest dropped first), and handed to the next allocation of
/// exactly their size. FSDP frees and re-gathers the same buffer sizes over
/// and over; without the cache each one comes back from the kernel as fresh
/// pages to fault in and zero (on `large` that was a fifth of the step). Off
/// (0) until set; counted as cached, not live, so the categories stay exact.
void set_block_cache_limit(int64_t bytes);
/// The cache's limit in bytes (0: off).
int64_t block_cache_limit();
void empty_block_cache();  ///< frees every cached block; the limit stays

/// A GPU's memory as the CUDA caching allocator sees it (every tensor on the
/// device, ours and the model's; the categories above count host memory):
/// bytes in live tensors and reserved from the driver, now and at their peak
/// since the last reset_device_peaks(). Zeros for a CPU device and in builds
/// without CUDA.
struct DeviceUsage {
  /// Bytes in live tensors, now and at their peak.
  ///@{
  int64_t allocated = 0, peak_allocated = 0;
  ///@}
  /// Bytes reserved from the driver (live or cached), now and at their peak.
  ///@{
  int64_t reserved = 0, peak_reserved = 0;
  ///@}
};
/// `device`'s memory (see DeviceUsage).
DeviceUsage device_usage(c10::Device device);
/// Starts a new peak window for device_usage(): its peaks are set to the current values.
void reset_device_peaks(c10::Device device);

/// Attributes the allocations made on this thread while it lives.
class MemoryCategoryScope {
 public:
  /// Makes `category` current on this thread (the previous one comes back on destruction).
  explicit MemoryCategoryScope(Category category);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  Category previous_;
};

/// Deferred initialization (the C++ counterpart of building a model on
/// PyTorch's meta device): while a DeferredInit lives, CPU allocations on
/// this thread take no memory of their own. They all share one lazily
/// committed scratch region, so a model's constructor can run (and write its
/// throwaway initial values) using only as much memory as its largest single
/// tensor. Such "deferred" tensors have the right shapes but no values;
/// fully_shard() with FullyShardOptions::param_init_fn materializes and
/// initializes the parameters one unit at a time, sharding each unit before
/// the next is built. Buffers must not be created in a deferred constructor
/// (they would keep no values). Needs the counting allocator.
class DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();  ///< gives the scratch region's memory back
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
};

}  // namespace fsdp::memory
