// Device and backend selection, and the scheduler-world check.

#include "fsdp/device_choice.h"
#include "core/cpu_features.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace fsdp {

DeviceChoice choose_device(c10::DeviceType device, CollectiveBackend backend, const ProcessGroupPtr& world) {
  DeviceChoice choice;
  choice.group = world;
  if (device == c10::DeviceType::CPU) {
    TORCH_CHECK(backend != CollectiveBackend::kNccl, "the NCCL backend needs CUDA devices, got the CPU");
    return choice;
  }
  TORCH_CHECK(device == c10::DeviceType::CUDA, "choose_device: the CPU or CUDA, got ", c10::DeviceTypeName(device));
  const int gpus = cuda_device_count();
  TORCH_CHECK(gpus > 0, cuda_build() ? "this process sees no GPU (CUDA_VISIBLE_DEVICES, the driver?)"
                                     : "this fsdp-cpp was built without CUDA (build against a LibTorch with CUDA: "
                                       "scripts/setup.sh wheel)");
  const ProcessGroupPtr host = world->split_shared_memory();
  choice.device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(host->rank() % gpus));
  // This rank's current device from here on: pinned host memory and any
  // call without a device then make no context on GPU 0.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(choice.device);
  const bool own_gpu = host->size() <= gpus;
  TORCH_CHECK(backend != CollectiveBackend::kNccl || own_gpu, "the NCCL backend needs a GPU per rank: ", host->size(),
              " ranks on this host share ", gpus, " GPU(s); use the MPI backend (or auto)");
  if (backend == CollectiveBackend::kMpi) return choice;
  if (world->size() == 1) {
    // One rank: its collectives are copies on its own GPU; NCCL, which may
    // not work where a first GPU run is tried, is never touched.
    choice.group = make_local_process_group(choice.device);
    choice.backend = "local";
  } else if (backend == CollectiveBackend::kNccl || own_gpu) {
    choice.group = make_nccl_process_group(world, choice.device);
    choice.backend = "nccl";
  }
  return choice;
}

void check_scheduler_world(int world_size) {
  if (world_size != 1 || std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    TORCH_CHECK(!value || std::atoi(value) <= 1, "the scheduler started ", value, " tasks (", name, "=", value,
                "), but MPI sees a world of 1: each task would train alone. Start the ranks through the scheduler's ",
                "PMI (srun --mpi=pmix, with an OpenMPI built with PMIx) or with mpirun / fsdp-run inside the allocation");
  }
}

std::string cpu_bf16_warning(const std::string& cpuinfo) {
  // The first processor's "flags" (x86) or "Features" (Arm) line, and its "model name".
  auto field = [&](const std::string& name) -> std::string {
    std::istringstream lines(cpuinfo);
    for (std::string line; std::getline(lines, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      key.erase(key.find_last_not_of(" \t") + 1);
      if (key == name) return line.substr(colon + 1);
    }
    return "";
  };
  std::string flags = field("flags");
  const bool arm = flags.empty();
  if (arm) flags = field("Features");
  if (flags.empty()) return "";  // says nothing: no warning on a guess
  std::set<std::string> has;
  std::istringstream words(flags);
  for (std::string w; words >> w;) has.insert(w);
  if (has.count("avx512_bf16") || has.count("amx_bf16") || has.count("bf16")) return "";
  std::vector<std::string> vector_units;
  for (const char* f : {"avx2", "avx512f", "avx512_vnni", "asimd", "sve"}) {
    if (has.count(f)) vector_units.emplace_back(f);
  }
  std::string model = field("model name");
  model.erase(0, model.find_first_not_of(' '));
  return c10::str("bf16 compute on this CPU (", model.empty() ? std::string("model not named") : model, "; it has ",
                  vector_units.empty() ? std::string("none of AVX2, AVX-512F, NEON or SVE") : c10::Join(", ", vector_units),
                  ", but neither AVX-512 BF16 nor AMX", arm ? " (nor Arm's BF16)" : "",
                  ") runs in emulation: about 30x slower than fp32 (measured on an AVX2-only AMD EPYC: a bf16 medium "
                  "step 42 s, 1.3 s in fp32). fp32 (--param-dtype fp32) is the faster choice here");
}

std::string cpu_bf16_warning() {
  const char* stand_in = std::getenv("FSDP_CPUINFO");  // another machine's, for the tools' tests
  std::ifstream in(stand_in ? stand_in : "/proc/cpuinfo");
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return cpu_bf16_warning(text.str());
}

}  // namespace fsdp
