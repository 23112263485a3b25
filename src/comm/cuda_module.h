// The seam between libfsdp (CPU only) and the CUDA module, libfsdp_cuda.so.
//
// In the CUDA configuration, libfsdp and the tools link LibTorch's CPU
// libraries alone (libtorch_cpu, libc10): a CPU run maps no CUDA library and
// keeps about 200 MiB less resident. What needs CUDA (the NCCL group, the
// caching allocator's statistics, c10_cuda's device count) is built into the
// module, which links libtorch_cuda (its kernels and hooks register when it
// loads), libc10_cuda, the CUDA runtime and NCCL. cuda_module.cpp loads it
// the first time a run asks for a GPU; docs/gpus.md says when that is.
//
// The module calls back into libfsdp (ProcessGroup, the watchdog): the
// programs that link libfsdp export its symbols (fsdp's INTERFACE link
// option --export-dynamic, CMakeLists.txt says why), so that each class has
// one copy, the program's.

#pragma once

#include "fsdp/comm.h"
#include "fsdp/memory.h"

namespace fsdp::cuda_module {

// What the module provides, by function pointer. Its layout is checked at
// load: the module must come from the same build as the library.
struct Entry {
  ProcessGroupPtr (*make_nccl_process_group)(const ProcessGroupPtr& bootstrap, c10::Device device);
  int (*device_count)();
  memory::DeviceUsage (*device_usage)(c10::Device device);
  void (*reset_device_peaks)(c10::Device device);
};

// The module's file name; the loader looks for it where cuda_module.cpp says.
constexpr const char* kFileName = "libfsdp_cuda.so";

// The one symbol the loader looks up in the module (C linkage: unmangled).
constexpr const char* kEntrySymbol = "fsdp_cuda_module_entry";

// The module's entry points, loading it on the first call. Fails, naming
// each place it looked and what it found there, when no module loads.
const Entry& load();

// Fails, saying what to do, where the module has GPUs to use but LibTorch
// settled on no CUDA before it was loaded (cuda_module.cpp says how).
void check_cuda_hooks(const Entry& entry);

// Whether this machine has an NVIDIA driver a CUDA program could use (its
// device nodes), checked without loading anything.
bool driver_present();

// Whether the module is loaded (nothing is loaded by asking).
bool loaded();

// The module's side (nccl_process_group.cpp, device_memory_cuda.cpp): what
// Entry points to. Never in libfsdp, so never two definitions of one name.
namespace in_module {
ProcessGroupPtr make_nccl_process_group(const ProcessGroupPtr& bootstrap, c10::Device device);
int device_count();
memory::DeviceUsage device_usage(c10::Device device);
void reset_device_peaks(c10::Device device);
}  // namespace in_module

}  // namespace fsdp::cuda_module

// Defined by the module (cuda_module_entry.cpp): its entry points, and the
// build it comes from (the loader refuses a module of another build).
extern "C" const fsdp::cuda_module::Entry* fsdp_cuda_module_entry(const char** build_id);
