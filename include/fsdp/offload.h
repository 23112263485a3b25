#pragma once
/// \file
/// Disk offload: its options and a read-only view.
///
/// What a user sets and sees of disk offload (OffloadPolicy::nvme):
/// the scratch files' folder and I/O engine, and a read-only view of a model's
/// offload (FsdpState::nvme_offload()). The machinery behind it (the disk
/// store, the per-unit placement of shards) is the engine's own, not installed.

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>
#include "fsdp/enum_names.h"

namespace fsdp::offload {

/// How the scratch file is read and written.
/// Named by enum_name, parsed by parse_enum: "auto", "libaio", "threads".
enum class IoEngine {
  kAuto,    ///< libaio with O_DIRECT where the file system and the kernel allow it, else threads
  kLibaio,  ///< libaio with O_DIRECT, or refused where it is unavailable
  kThreads  ///< a worker thread with pread/pwrite (buffered)
};
}  // namespace fsdp::offload
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<offload::IoEngine>);  ///< "auto", "libaio", "threads"
}  // namespace fsdp::detail
namespace fsdp::offload {

/// Where and how a rank's scratch file is kept.
struct DiskStoreOptions {
  /// `dir`: the folder the scratch file goes in (it must exist).
  explicit DiskStoreOptions(std::string dir) : dir_(std::move(dir)) {}
  /// The folder the scratch file goes in (it must exist).
  TORCH_ARG(std::string, dir);
  /// The file is `DIR/fsdp-offload-<name>.bin`: one per rank ("rank3"; fully_shard sets it per rank).
  TORCH_ARG(std::string, name) = "rank0";
  /// The I/O engine (see IoEngine).
  TORCH_ARG(IoEngine, engine) = IoEngine::kAuto;
  /// The unit of I/O and of checksums: a multiple of 4096 (O_DIRECT's alignment).
  TORCH_ARG(int64_t, block_bytes) = int64_t{1} << 20;
  /// Blocks in flight at once (libaio), and so the staging buffers: queue_depth x block_bytes of memory.
  TORCH_ARG(int, queue_depth) = 8;
  /// Treat the folder as having at most this many bytes free (-1: what the
  /// file system says): for tests of a full disk, and to leave room for others.
  TORCH_ARG(int64_t, free_bytes_limit) = -1;
};

/// A model's disk traffic so far, and how long compute waited for it.
struct OffloadStats {
  int64_t bytes_read = 0;     ///< from the scratch file
  int64_t bytes_written = 0;  ///< to the scratch file
  double wait_seconds = 0;    ///< compute blocked on a read or a write
  double copy_seconds = 0;      ///< the I/O thread copying between tensors and O_DIRECT staging buffers
  /// Bytes of those copies: only memory O_DIRECT cannot take in place (a
  /// slot's ragged last block, memory not page-aligned) is staged.
  int64_t bytes_staged = 0;
  double checksum_seconds = 0;  ///< the I/O thread checksumming blocks (XXH3)
  double disk_seconds = 0;      ///< the I/O thread in the disk's hands (io_submit/io_getevents, or pread/pwrite)
  /// The units read ahead of their use now (NvmeOffloadOptions::read_ahead,
  /// deepened up to max_read_ahead where compute waited on the disk); 0 without disk offload.
  int read_ahead = 0;
};

/// What a model's disk offload is, for reports: FsdpState::nvme_offload().
struct NvmeOffloadInfo {
  bool optimizer_state = false;    ///< AdamW's moments (and bf16/fp16 parameters' fp32 masters) are offloaded
  bool params = false;             ///< the parameter shards are offloaded
  std::string file_path;           ///< this rank's scratch file (its name is removed once it is open)
  std::string engine_description;  ///< e.g. "libaio, O_DIRECT", or the fallback taken and why
  int64_t offloaded_bytes = 0;     ///< the scratch file's size: the memory the offloaded state would take
  bool stepped_in_backward = false;  ///< the last step stepped each unit during backward (NvmeOffloadOptions::step_in_backward)
  /// The last step (clipped or loss-scaled) wrote each gradient out as it
  /// arrived and left each unit's update for its next all-gather.
  bool stepped_before_next_gather = false;
  OffloadStats stats;              ///< the traffic since the model was built
};

}  // namespace fsdp::offload
