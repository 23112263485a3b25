// What the CUDA configuration provides, in a build without it: refusals that
// say how to get it, and zero device figures.

#include "fsdp/comm.h"
#include "fsdp/memory.h"

namespace fsdp {

ProcessGroupPtr make_nccl_process_group(const ProcessGroupPtr&, c10::Device device) {
  TORCH_CHECK(false, "an NCCL process group (for ", device,
              ") needs fsdp-cpp's CUDA configuration: build against a LibTorch with CUDA (a PyPI torch wheel, "
              "scripts/setup.sh wheel) with -DFSDP_CUDA=ON");
}

bool cuda_build() { return false; }

int cuda_device_count() { return 0; }

namespace memory {

DeviceUsage device_usage(c10::Device) { return {}; }

void reset_device_peaks(c10::Device) {}

}  // namespace memory
}  // namespace fsdp
