// The CUDA module's entry point (comm/cuda_module.h): the one symbol the
// loader looks up, with the build the module comes from.

#include "comm/cuda_module.h"

#ifndef FSDP_CUDA_MODULE_BUILD_ID
#error "FSDP_CUDA_MODULE_BUILD_ID is not defined (CMakeLists.txt sets it for this file)"
#endif

extern "C" const fsdp::cuda_module::Entry* fsdp_cuda_module_entry(const char** build_id) {
  namespace in_module = fsdp::cuda_module::in_module;
  static const fsdp::cuda_module::Entry entry{in_module::make_nccl_process_group, in_module::device_count,
                                              in_module::device_usage, in_module::reset_device_peaks};
  *build_id = FSDP_CUDA_MODULE_BUILD_ID;
  return &entry;
}
