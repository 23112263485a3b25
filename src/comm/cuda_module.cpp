// The CUDA configuration's functions in libfsdp: each loads the CUDA module
// (libfsdp_cuda.so, cuda_module.h says why it is apart) the first time a run
// asks for a GPU, and forwards to it. A CPU run never loads it: a CPU device
// needs nothing from it, and a machine without an NVIDIA driver has no GPU
// to count.

#include "comm/cuda_module.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include "comm/collective_watchdog.h"

// Set by CMakeLists.txt for this file: where the build puts the module, where
// the install puts it (absolute, and from the tools' folder), and this
// build's identity, which the module must carry too.
#ifndef FSDP_CUDA_MODULE_BUILD_PATH
#error "FSDP_CUDA_MODULE_BUILD_PATH is not defined (CMakeLists.txt sets it for this file)"
#endif

namespace fsdp {
namespace cuda_module {
namespace {

// The module uses these libfsdp classes that a program may not: a static
// libfsdp puts an object file in the program only where the program refers
// to it, and the module finds them in the program (exported). Referring to
// them here (this file is in every program that can load the module) keeps
// them there, and keeps one copy of each.
// (The module's undefined fsdp:: symbols: nm -uC libfsdp_cuda.so; the
// trainer case cpu-without-cuda checks the program exports each.)
[[gnu::used]] const auto kModuleNeedsWatchdog = &CollectiveWatchdog::in_flight;
[[gnu::used]] const auto kModuleNeedsLocalGroup = &make_local_process_group;
[[gnu::used]] const auto kModuleNeedsAbort = &MpiEnvironment::abort_with_message;

std::filesystem::path program_folder() {
  std::error_code error;
  const auto program = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : program.parent_path();
}

// Where the module may be, in order: FSDP_CUDA_MODULE alone when set; else
// beside the program (the build tree's tools), in the install's library
// folder relative to the program (installed tools), the build tree (its
// tests and examples), the install prefix (programs built against the
// installed package), and last the dynamic loader's own search
// (LD_LIBRARY_PATH, the program's RUNPATH).
std::vector<std::string> candidates() {
  if (const char* chosen = std::getenv("FSDP_CUDA_MODULE"); chosen && *chosen) return {chosen};
  std::vector<std::string> places;
  const auto folder = program_folder();
  if (!folder.empty()) {
    places.push_back((folder / kFileName).string());
    places.push_back((folder / FSDP_CUDA_MODULE_RELATIVE_DIR / kFileName).lexically_normal().string());
  }
  places.push_back(FSDP_CUDA_MODULE_BUILD_PATH);
  places.push_back(FSDP_CUDA_MODULE_INSTALL_PATH);
  places.push_back(kFileName);
  return places;
}

}  // namespace

// LibTorch settles on its CUDA hooks the first time anything asks about CUDA
// (torch::manual_seed does): asked before libtorch_cuda was loaded, it
// settles on none for the life of the process, and every CUDA tensor then
// fails. Said where a GPU is there to use, with what to do, rather than at
// the first tensor. (Without a GPU nothing of CUDA runs either way: the
// callers' own refusals say so.) Where FSDP_CUDA_MODULE names the module,
// always: that is a test of the module, which holds a program's order to this
// without a GPU (tests/trainer/cases/cpu-without-cuda.sh).
void check_cuda_hooks(const Entry& entry) {
  if (entry.device_count() == 0 && !std::getenv("FSDP_CUDA_MODULE")) return;
  const auto& hooks = at::detail::getCUDAHooks();
  TORCH_CHECK(typeid(hooks) != typeid(at::CUDAHooksInterface),
              "the CUDA module loaded, but LibTorch had already settled on no CUDA: something asked it about CUDA "
              "(torch::manual_seed does) before the module was loaded. Ask for the GPU first: fsdp::choose_device or "
              "fsdp::cuda_device_count() before the first seed");
}

namespace {

// Loads one candidate; on failure returns why (the reason, no throw).
std::string try_load(const std::string& place, const Entry*& entry) {
  const bool by_path = place.find('/') != std::string::npos;
  if (by_path && !std::filesystem::exists(place)) return "absent";
  // RTLD_GLOBAL: libtorch_cuda's symbols are for everyone (LibTorch's own
  // lookups), as when it is linked.
  void* handle = dlopen(place.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) return dlerror();
  using EntryFunction = const Entry* (*)(const char**);
  auto* function = reinterpret_cast<EntryFunction>(dlsym(handle, kEntrySymbol));
  if (!function) return std::string("no ") + kEntrySymbol + " in it";
  const char* build = nullptr;
  const Entry* found = function(&build);
  if (!build || std::string(build) != FSDP_CUDA_MODULE_BUILD_ID)
    return std::string("from another build (") + (build ? build : "none") + ", expected " + FSDP_CUDA_MODULE_BUILD_ID +
           ")";
  entry = found;
  return "";
}

const Entry* load_once() {
  std::string looked;
  for (const std::string& place : candidates()) {
    const Entry* entry = nullptr;
    const std::string why = try_load(place, entry);
    if (entry) return entry;
    looked += "\n  " + place + ": " + why;
  }
  TORCH_CHECK(false, "this run asks for a GPU, which needs fsdp-cpp's CUDA module (", kFileName,
              "), and none loaded; looked at:", looked,
              "\n(it is built beside the tools and installed beside libfsdp; FSDP_CUDA_MODULE names the file)");
}

std::once_flag load_flag;
const Entry* loaded_entry = nullptr;

}  // namespace

const Entry& load() {
  // call_once: a failed load throws, and the next call tries again.
  std::call_once(load_flag, [] { loaded_entry = load_once(); });
  return *loaded_entry;
}

bool loaded() { return loaded_entry != nullptr; }

bool driver_present() {
  // The NVIDIA driver's control node (Linux), or WSL's GPU node.
  for (const char* node : {"/dev/nvidiactl", "/dev/dxg"})
    if (::access(node, F_OK) == 0) return true;
  return false;
}

}  // namespace cuda_module

ProcessGroupPtr make_nccl_process_group(const ProcessGroupPtr& bootstrap, c10::Device device) {
  const cuda_module::Entry& module = cuda_module::load();
  cuda_module::check_cuda_hooks(module);
  return module.make_nccl_process_group(bootstrap, device);
}

bool cuda_build() { return true; }

int cuda_device_count() {
  // Without a driver, no GPU: the module is not loaded to count none (unless
  // FSDP_CUDA_MODULE names it: a test of the module itself).
  if (!cuda_module::loaded() && !cuda_module::driver_present() && !std::getenv("FSDP_CUDA_MODULE")) return 0;
  const cuda_module::Entry& module = cuda_module::load();
  cuda_module::check_cuda_hooks(module);
  return module.device_count();
}

namespace memory {

// A CUDA device's figures exist only once a run has asked for that GPU (the
// module is then loaded); other devices have none.
DeviceUsage device_usage(c10::Device device) {
  if (!device.is_cuda()) return {};
  return cuda_module::load().device_usage(device);
}

void reset_device_peaks(c10::Device device) {
  if (device.is_cuda()) cuda_module::load().reset_device_peaks(device);
}

}  // namespace memory
}  // namespace fsdp
