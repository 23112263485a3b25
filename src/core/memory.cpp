// The counting allocator. It wraps the allocator LibTorch had installed: each
// allocation is made by that allocator and carried in a small record that
// remembers its size and category, so the free knows what to subtract.

#include "fsdp/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <mutex>

#include "fsdp/compat.h"

namespace fsdp::memory {
namespace {

thread_local Category current_category = Category::kOther;

struct Counters {
  std::mutex mutex;
  Usage usage;
};

Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: frees can come during static destruction
  return *c;
}

struct Record {
  c10::DataPtr inner;
  int64_t bytes;
  Category category;
};

void add(Category category, int64_t bytes) {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto i = static_cast<size_t>(category);
  c.usage.live_bytes[i] += bytes;
  c.usage.live_total += bytes;
  if (c.usage.live_bytes[i] > c.usage.peak_bytes[i]) c.usage.peak_bytes[i] = c.usage.live_bytes[i];
  if (c.usage.live_total > c.usage.peak_total) c.usage.peak_total = c.usage.live_total;
}

void release(void* context) {
  auto* record = static_cast<Record*>(context);
  add(record->category, -record->bytes);
  delete record;  // the inner DataPtr frees the memory
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t nbytes) FSDP_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(nbytes);
    void* data = inner.get();
    c10::Device device = inner.device();
    auto* record = new Record{std::move(inner), static_cast<int64_t>(nbytes), current_category};
    add(record->category, record->bytes);
    return {data, record, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

#if FSDP_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif

 private:
  c10::Allocator* inner_;
};

CountingAllocator* installed = nullptr;

}  // namespace

const char* category_name(Category c) {
  switch (c) {
    case Category::kParameterShard: return "parameter_shards";
    case Category::kGradientShard: return "gradient_shards";
    case Category::kOptimizerState: return "optimizer_state";
    case Category::kUnshardedBuffer: return "unsharded_buffers";
    case Category::kOther: return "other";
    case Category::kCount: break;
  }
  return "unknown";
}

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

void reset_peaks() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.usage.peak_bytes = c.usage.live_bytes;
  c.usage.peak_total = c.usage.live_total;
}

MemoryCategoryScope::MemoryCategoryScope(Category category) : previous_(current_category) {
  current_category = category;
}

MemoryCategoryScope::~MemoryCategoryScope() { current_category = previous_; }

}  // namespace fsdp::memory
