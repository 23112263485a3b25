#pragma once
// Fault injection for the crash-safety tests of saves; not part of the API.

#include <cstdint>
#include <string>

namespace fsdp::detail {

// Kills this process (SIGKILL) if the environment says
// FSDP_TEST_KILL_IN_SAVE=<rank>:<n> and this is that rank's n-th save (full
// or sharded), after its first unit; sends it SIGTERM there (a preemption
// arriving mid-save) for FSDP_TEST_SIGNAL_IN_SAVE=<rank>:<n>. Does nothing
// otherwise.
void maybe_kill_for_test(int rank);

// Disk offload's faults, if the environment says
// FSDP_TEST_OFFLOAD_FAULT=<rank>:<step>:<kind> and this is that rank's
// <step>-th optimizer step through the offload (1-based):
//   kill      SIGKILL in the middle of the step (`mid_step`: after its first
//             unit's writes were queued, its reads still to come)
//   corrupt   at the step's end, one byte of the scratch file's first block
//             changed (the next read of that block fails its checksum)
//   truncate  at the step's end, the scratch file cut to half its size
// Does nothing otherwise.
void maybe_fault_offload_for_test(int rank, int64_t step, const std::string& scratch_path, bool mid_step);

}  // namespace fsdp::detail

namespace fsdp::detail {

// Asynchronous checkpoints' background write sleeps this long before its
// first file if the environment says FSDP_TEST_BACKGROUND_WRITE_DELAY_MS=<ms>
// (tests: training goes on, a second save waits, the folder is changed
// under the write). Does nothing otherwise.
void maybe_delay_background_write_for_test();

}  // namespace fsdp::detail

namespace fsdp::detail {

// Sends this process SIGTERM if the environment says
// FSDP_TEST_SIGNAL_IN_SETUP=<rank> and this is that rank: a preemption that
// arrives while a run is still being set up, before its first step (tests:
// the run ends at once, leaving nothing). Does nothing otherwise.
void maybe_signal_in_setup_for_test(int rank);

}  // namespace fsdp::detail
