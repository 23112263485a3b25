#pragma once
// What this CPU does in bf16, for the warnings fsdp-train and fsdp-plan print.

#include "fsdp/device_choice.h"

namespace fsdp {

/// bf16 compute on a CPU without bf16 instructions (x86 without AVX-512 BF16
/// or AMX, Arm without BF16) runs in emulation, about 30 times slower than
/// fp32, for LibTorch and PyTorch alike (measured on an AVX2-only AMD EPYC,
/// 2026-12-03: a bf16 `medium` step 42 s, 1.3 s in fp32). Given the text of
/// /proc/cpuinfo: empty where the CPU has them, or the text does not say;
/// else a warning naming the CPU, the vector instructions it has, and the
/// slowdown.
std::string cpu_bf16_warning(const std::string& cpuinfo);

/// cpu_bf16_warning() of this machine's /proc/cpuinfo, or of the file that
/// FSDP_CPUINFO names (another machine's, as the tools' tests give it); empty
/// where it cannot be read.
std::string cpu_bf16_warning();

}  // namespace fsdp
