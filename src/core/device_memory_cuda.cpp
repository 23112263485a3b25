// Device memory figures from the CUDA caching allocator (the CUDA
// configuration; built into the CUDA module, comm/cuda_module.h: the module's
// side of fsdp::memory::device_usage and reset_device_peaks).

#include <c10/cuda/CUDACachingAllocator.h>

#include "comm/cuda_module.h"

namespace fsdp::cuda_module::in_module {

memory::DeviceUsage device_usage(c10::Device device) {
  if (!device.is_cuda()) return {};
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  // StatType::AGGREGATE, index 0 in every LibTorch 2.x (the enum moved
  // between namespaces across versions; the index did not).
  constexpr size_t aggregate = 0;
  memory::DeviceUsage usage;
  usage.allocated = stats.allocated_bytes[aggregate].current;
  usage.peak_allocated = stats.allocated_bytes[aggregate].peak;
  usage.reserved = stats.reserved_bytes[aggregate].current;
  usage.peak_reserved = stats.reserved_bytes[aggregate].peak;
  return usage;
}

void reset_device_peaks(c10::Device device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

}  // namespace fsdp::cuda_module::in_module
