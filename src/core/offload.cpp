// What include/fsdp/offload.h declares beside its structs: the I/O engines'
// names and the scratch files' names and room. On core's floor, the
// planner's preflight (host_memory.cpp) and the disk store (src/offload/)
// both use them.

#include "fsdp/offload.h"
#include "core/scratch_file.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<offload::IoEngine>) {
  static const EnumNames names = EnumNames::of<offload::IoEngine>("offload I/O engine", {
      {offload::IoEngine::kAuto, "auto"},
      {offload::IoEngine::kLibaio, "libaio"},
      {offload::IoEngine::kThreads, "threads"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::offload {

std::string scratch_file_path(const DiskStoreOptions& options) {
  return options.dir() + "/fsdp-offload-" + options.name() + ".bin";
}

std::string rank_scratch_name(int rank) { return "rank" + std::to_string(rank); }

int64_t scratch_bytes_free(const std::string& dir, const std::vector<std::string>& reused) {
  struct statvfs fs {};
  TORCH_CHECK(::statvfs(dir.c_str(), &fs) == 0, "offload: cannot use the folder '", dir, "': ", std::strerror(errno));
  int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  for (const std::string& path : reused) {
    struct stat existing {};
    if (::stat(path.c_str(), &existing) == 0) free_bytes += static_cast<int64_t>(existing.st_blocks) * 512;
  }
  return free_bytes;
}

}  // namespace fsdp::offload
