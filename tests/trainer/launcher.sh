#!/usr/bin/env bash
# fsdp-run: the exit status passes through, and threads per rank = cores /
# ranks; MPI yields the core while it waits.
source "$(dirname "$0")/lib.sh" "$@"

"$run" -n 2 -- true || fail "fsdp-run of true failed"
! "$run" -n 2 -- false || fail "fsdp-run of false succeeded"
threads=$("$run" -n 1 -- printenv OMP_NUM_THREADS)
[ "$threads" = "$(nproc)" ] || fail "1 rank got $threads threads, expected $(nproc)"
many=$(( $(nproc) * 2 ))
[ "$("$run" -n "$many" -- printenv OMP_NUM_THREADS | sort -u)" = 1 ] || fail "oversubscribed ranks did not get 1 thread"
[ "$("$run" -n "$many" -- printenv OMP_NUM_THREADS | wc -l)" -eq "$many" ] || fail "not every one of $many ranks ran"
# The communication thread's busy-poll would take the core from the compute threads.
[ "$("$run" -n 2 -- printenv OMPI_MCA_mpi_yield_when_idle | sort -u)" = 1 ] || fail "MPI does not yield when idle"
# The trainer sees those threads.
train_run one 1 --preset tiny --steps 1
json_is "$work/one.json" .threads_per_rank "$(nproc)"
pass
