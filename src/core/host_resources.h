#pragma once
// What this host has for a run, as the preflights and the tools read it:
// memory, the ranks sharing it, and disk room for offload's scratch files.
// Not installed: a training program asks
// fsdp-train's preflight (or fsdp::preflight_host_memory) instead.

#include <cstdint>
#include <string>

namespace fsdp {

// The memory this host can still give (bytes): /proc/meminfo's MemAvailable,
// or less under a cgroup v2 limit (memory.max - memory.current). The
// environment variable FSDP_PREFLIGHT_AVAILABLE_BYTES overrides (to check
// the preflight itself).
int64_t host_memory_available();

// The ranks of this host: mpirun's OMPI_COMM_WORLD_LOCAL_SIZE, else all of
// `world_size`.
int ranks_on_this_host(int world_size);

// The bytes disk offload's scratch files may take in `dir`
// (offload::scratch_bytes_free, with the world's scratch files already
// there counted as free: each rank truncates its own). The environment
// variable FSDP_PREFLIGHT_DISK_FREE_BYTES overrides (to check the
// preflight itself).
int64_t scratch_space_available(const std::string& dir, int world_size);

}  // namespace fsdp
