// The counting allocator. It wraps the allocator LibTorch had installed:
// each allocation is made by that allocator, and a side table keyed by the
// data pointer remembers its size and category, so the free knows what to
// subtract. Context == data pointer, so LibTorch's raw_allocate path (used
// by its oneDNN kernels) works too.

#include "fsdp/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/compat.h"
#include "base/memory_counters.h"

namespace fsdp::memory {
namespace {

thread_local Category current_category = Category::kOther;
thread_local int deferred_depth = 0;

// The scratch region every deferred allocation points into: reserved
// address space, committed only where written, given back (MADV_DONTNEED)
// when the last DeferredInit ends. Never unmapped, so a deferred tensor
// that outlives its scope reads zeros rather than crashing.
constexpr size_t kScratchBytes = size_t{1} << 38;  // 256 GiB of address space
std::mutex scratch_mutex;
char* scratch = nullptr;
size_t scratch_high_water = 0;  // the largest deferred allocation: counted as live "other" bytes

struct Record {
  c10::DataPtr inner;  // frees the memory when destroyed
  int64_t bytes;
  Category category;
};

// A freed block kept for the next allocation of exactly its size.
struct CachedBlock {
  c10::DataPtr inner;
  int64_t bytes;
};

struct Counters {
  std::mutex mutex;
  Usage usage;
  std::unordered_map<void*, Record> live;
  // Oldest first. Exact sizes only: FSDP's buffers repeat exactly (every
  // block's gathered parameters, gradient buffer and reduction output have
  // one size), so reuse needs no splitting and cannot fragment.
  std::deque<CachedBlock> cache;
  int64_t cache_limit = 0;
};

// Blocks smaller than this go back to malloc, which recycles them without
// touching the kernel anyway.
constexpr int64_t kMinCachedBytes = int64_t{1} << 20;

// The engine's own buffers (every category but kOther) of kMinCachedBytes
// or more are pages of their own, mapped here rather than by malloc:
// - page-aligned, so the disk offload reads and writes them in place with
//   O_DIRECT (src/offload/disk_store.h), with no staging copy;
// - given back to the kernel whole when freed past the block cache. From
//   malloc, blocks under glibc's largest mmap threshold (32 MiB) come from
//   its heap, which the offload's traffic of shard-sized blocks fragments:
//   xl with both offloads held 10 GB resident for 2.8 GB of tensors.
// Activations and temporaries (kOther) stay with malloc, whose heap
// recycles their many sizes without a page fault.
constexpr size_t kPageBytes = 4096;

struct Mapping {
  void* base;
  size_t bytes;
};

void unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  ::munmap(mapping->base, mapping->bytes);
  delete mapping;
}

c10::DataPtr map_pages(size_t nbytes, Category category) {
  const size_t bytes = (nbytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(base != MAP_FAILED, "out of memory: cannot map ", bytes, " bytes for ", fsdp::enum_name(category), ": ",
              std::strerror(errno));
  return {base, new Mapping{base, bytes}, &unmap, c10::Device(c10::DeviceType::CPU)};
}

void note_reserved(Counters& c) {
  const int64_t reserved = c.usage.live_total + c.usage.cached_bytes;
  if (reserved > c.usage.peak_reserved) c.usage.peak_reserved = reserved;
}

// Drops the oldest blocks until the cache fits `limit`; call with the mutex
// held and free what it returns after releasing it.
std::vector<c10::DataPtr> trim_cache(Counters& c, int64_t limit) {
  std::vector<c10::DataPtr> evicted;
  while (c.usage.cached_bytes > limit && !c.cache.empty()) {
    c.usage.cached_bytes -= c.cache.front().bytes;
    evicted.push_back(std::move(c.cache.front().inner));
    c.cache.pop_front();
  }
  return evicted;
}

Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: frees can come during static destruction
  return *c;
}

// Call with the mutex held.
void add(Counters& c, Category category, int64_t bytes) {
  auto i = static_cast<size_t>(category);
  c.usage.live_bytes[i] += bytes;
  c.usage.live_total += bytes;
  if (c.usage.live_bytes[i] > c.usage.peak_bytes[i]) c.usage.peak_bytes[i] = c.usage.live_bytes[i];
  if (c.usage.live_total > c.usage.peak_total) c.usage.peak_total = c.usage.live_total;
  note_reserved(c);
}

void release(void* data) {
  auto& c = counters();
  c10::DataPtr inner;
  std::vector<c10::DataPtr> evicted;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.live.find(data);
    if (it == c.live.end()) return;  // not ours: cannot happen for pointers we handed out
    const int64_t bytes = it->second.bytes;
    add(c, it->second.category, -bytes);
    if (bytes >= kMinCachedBytes && bytes <= c.cache_limit) {
      c.cache.push_back({std::move(it->second.inner), bytes});
      c.usage.cached_bytes += bytes;
      evicted = trim_cache(c, c.cache_limit);
    } else {
      inner = std::move(it->second.inner);
    }
    c.live.erase(it);
  }
  // `inner` and `evicted` free the memory here, outside the lock.
}

// A cached block of exactly `nbytes`, or an empty DataPtr.
c10::DataPtr take_cached(Counters& c, int64_t nbytes) {
  for (auto it = c.cache.rbegin(); it != c.cache.rend(); ++it) {  // the newest: its pages are the warmest
    if (it->bytes != nbytes) continue;
    c10::DataPtr block = std::move(it->inner);
    c.cache.erase(std::next(it).base());
    c.usage.cached_bytes -= nbytes;
    ++c.usage.cache_hits;
    return block;
  }
  return {};
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t nbytes) FSDP_ALLOCATE_CONST override {
    if (deferred_depth > 0 && nbytes > 0) return allocate_deferred(nbytes);
    auto& c = counters();
    if (static_cast<int64_t>(nbytes) >= kMinCachedBytes) {
      // A hit moves the block from cached to live in one step: live + cached never dips.
      std::lock_guard<std::mutex> lock(c.mutex);
      c10::DataPtr cached = take_cached(c, static_cast<int64_t>(nbytes));
      if (cached) return track(c, std::move(cached), nbytes);
    }
    c10::DataPtr inner = current_category != Category::kOther && static_cast<int64_t>(nbytes) >= kMinCachedBytes
                             ? map_pages(nbytes, current_category)
                             : inner_->allocate(nbytes);
    if (inner.get() == nullptr) return inner;  // zero bytes: nothing to count
    std::lock_guard<std::mutex> lock(c.mutex);
    return track(c, std::move(inner), nbytes);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  // Counts `inner` as live in the current category and wraps it; call with the mutex held.
  static c10::DataPtr track(Counters& c, c10::DataPtr inner, size_t nbytes) {
    void* data = inner.get();
    const c10::Device device = inner.device();
    add(c, current_category, static_cast<int64_t>(nbytes));
    c.live.emplace(data, Record{std::move(inner), static_cast<int64_t>(nbytes), current_category});
    return {data, data, &release, device};
  }

  static c10::DataPtr allocate_deferred(size_t nbytes) {
    std::lock_guard<std::mutex> lock(scratch_mutex);
    if (!scratch) {
      void* region = ::mmap(nullptr, kScratchBytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      TORCH_CHECK(region != MAP_FAILED, "DeferredInit: cannot reserve ", kScratchBytes, " bytes of address space");
      scratch = static_cast<char*>(region);
    }
    TORCH_CHECK(nbytes <= kScratchBytes, "DeferredInit: a tensor of ", nbytes, " bytes exceeds the ", kScratchBytes,
                "-byte deferred region");
    if (nbytes > scratch_high_water) {
      auto& c = counters();
      std::lock_guard<std::mutex> counters_lock(c.mutex);
      add(c, Category::kOther, static_cast<int64_t>(nbytes - scratch_high_water));
      scratch_high_water = nbytes;
    }
    return {scratch, scratch, [](void*) {}, c10::Device(c10::DeviceType::CPU)};
  }

#if FSDP_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif

 private:
  c10::Allocator* inner_;
};

CountingAllocator* installed = nullptr;

}  // namespace

}  // namespace fsdp::memory

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<memory::Category>) {
  static const EnumNames names = EnumNames::of<memory::Category>("memory category", {
      {memory::Category::kParameterShard, "parameter_shards"},
      {memory::Category::kGradientShard, "gradient_shards"},
      {memory::Category::kOptimizerState, "optimizer_state"},
      {memory::Category::kUnshardedBuffer, "unsharded_buffers"},
      {memory::Category::kSecondaryPartition, "secondary_partition"},
      {memory::Category::kOther, "other"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::memory {

int64_t Usage::model_state() const {
  return live(Category::kParameterShard) + live(Category::kGradientShard) + live(Category::kOptimizerState);
}

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    installed = new CountingAllocator(c10::GetCPUAllocator());
    // A priority above the default's, so LibTorch's own registration cannot replace it.
    c10::SetCPUAllocator(installed, /*priority=*/100);
  });
}

bool counting_allocator_installed() { return installed != nullptr; }

Usage usage() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.usage;
}

namespace {
std::mutex gathered_mutex;
GatheredUsage gathered;
}  // namespace

GatheredUsage gathered_usage() {
  std::lock_guard<std::mutex> lock(gathered_mutex);
  return gathered;
}

void count_host_bytes(Category category, int64_t delta) {
  if (!installed) return;
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  add(c, category, delta);
}

void count_gathered_bytes(int64_t delta) {
  std::lock_guard<std::mutex> lock(gathered_mutex);
  gathered.live += delta;
  gathered.peak = std::max(gathered.peak, gathered.live);
}

void reset_peaks() {
  {
    auto& c = counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.usage.peak_bytes = c.usage.live_bytes;
    c.usage.peak_total = c.usage.live_total;
    c.usage.peak_reserved = c.usage.live_total + c.usage.cached_bytes;
  }
  std::lock_guard<std::mutex> lock(gathered_mutex);
  gathered.peak = gathered.live;
}

void set_block_cache_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "set_block_cache_limit: expected a limit of 0 or more bytes, got ", bytes);
  auto& c = counters();
  std::vector<c10::DataPtr> evicted;
  std::lock_guard<std::mutex> lock(c.mutex);
  c.cache_limit = bytes;
  evicted = trim_cache(c, bytes);
}

int64_t block_cache_limit() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.cache_limit;
}

void empty_block_cache() {
  auto& c = counters();
  std::vector<c10::DataPtr> evicted;
  std::lock_guard<std::mutex> lock(c.mutex);
  evicted = trim_cache(c, 0);
}

DeferredInit::DeferredInit() {
  TORCH_CHECK(counting_allocator_installed(), "DeferredInit needs fsdp::memory::install_counting_allocator() first");
  ++deferred_depth;
}

DeferredInit::~DeferredInit() {
  if (--deferred_depth > 0) return;
  std::lock_guard<std::mutex> lock(scratch_mutex);
  if (!scratch || scratch_high_water == 0) return;
  ::madvise(scratch, scratch_high_water, MADV_DONTNEED);
  auto& c = counters();
  std::lock_guard<std::mutex> counters_lock(c.mutex);
  add(c, Category::kOther, -static_cast<int64_t>(scratch_high_water));
  scratch_high_water = 0;
}

bool is_deferred(const void* data) {
  std::lock_guard<std::mutex> lock(scratch_mutex);
  const char* p = static_cast<const char*>(data);
  return scratch && p >= scratch && p < scratch + kScratchBytes;
}

MemoryCategoryScope::MemoryCategoryScope(Category category) : previous_(current_category) {
  current_category = category;
}

MemoryCategoryScope::~MemoryCategoryScope() { current_category = previous_; }

}  // namespace fsdp::memory
