#pragma once
// Fault injection for the crash-safety tests of saves (full weights,
// checkpoints, their background writes); not part of the API. Defined beside
// what they hook: full_state_dict.cpp and checkpoint_save.cpp.

namespace fsdp::detail {

// Kills this process (SIGKILL) if the environment says
// FSDP_TEST_KILL_IN_SAVE=<rank>:<n> and this is that rank's n-th save (full
// or sharded), after its first unit; sends it SIGTERM there (a preemption
// arriving mid-save) for FSDP_TEST_SIGNAL_IN_SAVE=<rank>:<n>. Does nothing
// otherwise.
void maybe_kill_for_test(int rank);

// Asynchronous checkpoints' background write sleeps this long before its
// first file if the environment says FSDP_TEST_BACKGROUND_WRITE_DELAY_MS=<ms>
// (tests: training goes on, a second save waits, the folder is changed
// under the write). Does nothing otherwise.
void maybe_delay_background_write_for_test();

}  // namespace fsdp::detail
