#pragma once
// Fault injection for the preemption tests; not part of the API. Defined
// beside what it hooks (preemption.cpp); fsdp-train's setup calls it.

namespace fsdp::detail {

// Sends this process SIGTERM if the environment says
// FSDP_TEST_SIGNAL_IN_SETUP=<rank> and this is that rank: a preemption that
// arrives while a run is still being set up, before its first step (tests:
// the run ends at once, leaving nothing). Does nothing otherwise.
void maybe_signal_in_setup_for_test(int rank);

}  // namespace fsdp::detail
