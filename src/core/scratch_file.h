#pragma once
// A rank's scratch file for disk offload: its name and path, and the room its
// folder has (DiskStoreOptions in fsdp/offload.h).

#include "fsdp/offload.h"

namespace fsdp::offload {

/// The scratch file of a store with `options`: `DIR/fsdp-offload-<name>.bin`.
std::string scratch_file_path(const DiskStoreOptions& options);

/// The name fully_shard gives rank `rank`'s scratch file ("rank3").
std::string rank_scratch_name(int rank);

/// The bytes a scratch file may take in `dir`: what its file system gives an
/// unprivileged writer (statvfs), plus what the files at `reused` hold there
/// (a store truncates its own file, so an earlier run's counts as free).
/// Throws where `dir` cannot be examined.
int64_t scratch_bytes_free(const std::string& dir, const std::vector<std::string>& reused);

}  // namespace fsdp::offload
