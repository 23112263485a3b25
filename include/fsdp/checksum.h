#pragma once
/// \file
/// File checksums: the algorithms a file of ours may name (the hash itself
/// is the library's own, src/base/checksum.h).
///
/// Every file we write names its algorithm next to its checksum (safetensors:
/// the header metadata's "fsdp_checksum_algorithm"; metadata.json:
/// "checksum_algorithm"). New files get XXH3-64 (xxHash), which hashes at tens
/// of GB/s. Files written before algorithms were named carry FNV-1a 64, byte
/// at a time (under 1 GB/s): a file that names no algorithm is read as that,
/// so old checkpoints stay readable and verifiable. FNV-1a is kept for
/// reading only: nothing writes it any more. (Ours starts from the offset
/// 1469598103934665603, not FNV's published one: old files carry that.)

#include "fsdp/enum_names.h"

namespace fsdp::checksum {

/// A hash a file of ours may carry.
/// Named by enum_name, parsed by parse_enum: "fnv1a64", "xxh3_64" (what a file records).
enum class Algorithm {
  kFnv1a64,  ///< FNV-1a 64, byte at a time: files written before algorithms were named (read only)
  kXxh3_64   ///< XXH3-64 (xxHash): what every file is written with now
};

}  // namespace fsdp::checksum
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<checksum::Algorithm>);  ///< "fnv1a64", "xxh3_64": what a file records
}  // namespace fsdp::detail
