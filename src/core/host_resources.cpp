// What this host has for a run (core/host_resources.h): its memory, its
// ranks, and the room for disk offload's scratch files.

#include "core/host_resources.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "fsdp/offload.h"
#include "core/scratch_file.h"

namespace fsdp {

int64_t host_memory_available() {
  if (const char* forced = std::getenv("FSDP_PREFLIGHT_AVAILABLE_BYTES")) return static_cast<int64_t>(std::atoll(forced));
  int64_t available = std::numeric_limits<int64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    available = std::min<int64_t>(available, std::atoll(max_text.c_str()) - current);
  }
  return available;
}

int ranks_on_this_host(int world_size) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");  // mpirun's count of this host's ranks
  return local ? std::max(1, std::atoi(local)) : world_size;
}

int64_t scratch_space_available(const std::string& dir, int world_size) {
  if (const char* forced = std::getenv("FSDP_PREFLIGHT_DISK_FREE_BYTES")) return static_cast<int64_t>(std::atoll(forced));
  std::vector<std::string> reused;
  for (int rank = 0; rank < world_size; ++rank) {
    reused.push_back(offload::scratch_file_path(offload::DiskStoreOptions(dir).name(offload::rank_scratch_name(rank))));
  }
  return offload::scratch_bytes_free(dir, reused);
}

}  // namespace fsdp
