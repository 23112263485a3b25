#pragma once
// What the engine counts into the memory figures (fsdp/memory.h) beyond the
// counting allocator's own: the gathered buffers, host memory from other
// allocators, and whether the allocator and a deferred tensor are there.

#include "fsdp/memory.h"

namespace fsdp::memory {

/// Whether install_counting_allocator() was called (else every figure is 0).
bool counting_allocator_installed();

/// The units' gathered parameter buffers (FlatParam's unsharded buffers,
/// filled before each use and freed after), on whatever device they are:
/// bytes live now and at their peak since reset_peaks(), counted exactly where
/// fsdp-cpp fills and frees them. On a GPU this is the split of transient
/// device memory beside the CUDA caching allocator's totals, which cannot be
/// split by category the way the counting allocator splits host memory.
struct GatheredUsage {
  /// The gathered buffers' bytes now, and their peak since reset_peaks().
  ///@{
  int64_t live = 0, peak = 0;
  ///@}
};

/// The gathered buffers' bytes (see GatheredUsage).
GatheredUsage gathered_usage();

/// Host memory from another allocator than the CPU's, which the counting
/// allocator cannot see (pinned blocks, from CUDA's host allocator, for CPU
/// offload on a GPU): its owner counts `delta` bytes into (+) or out of (-)
/// `category` as it allocates and frees them. Ignored without the counting
/// allocator.
void count_host_bytes(Category category, int64_t delta);
void count_gathered_bytes(int64_t delta);  ///< FlatParam's, as it fills (+) and frees (-) a buffer

/// Whether a data pointer belongs to a deferred tensor.
bool is_deferred(const void* data);

}  // namespace fsdp::memory
