#pragma once
// Fault injection for the crash-safety tests of saves; not part of the API.

namespace fsdp::detail {

// Kills this process (SIGKILL) if the environment says
// FSDP_TEST_KILL_IN_SAVE=<rank>:<n> and this is that rank's n-th save (full
// or sharded), after its first unit. Does nothing otherwise.
void maybe_kill_for_test(int rank);

}  // namespace fsdp::detail
