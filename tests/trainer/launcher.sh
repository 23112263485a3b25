#!/usr/bin/env bash
# fsdp-run: the exit status passes through, and threads per rank = cores /
# ranks; MPI yields the core while it waits; large messages use Cross Memory
# Attach exactly when fsdp-cma-probe says the machine allows it.
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
# Single copy: what the probe allows, unless overridden; a failing probe
# (a container that forbids process_vm_readv) means plain copies.
mechanism() { "$@" -n 2 -- printenv OMPI_MCA_btl_vader_single_copy_mechanism | sort -u; }
if "$build/fsdp-cma-probe"; then allowed=cma; else allowed=none; fi
[ "$(mechanism "$run")" = "$allowed" ] || fail "single copy '$(mechanism "$run")', but the probe allows '$allowed'"
[ "$(FSDP_MPI_SINGLE_COPY=none mechanism "$run")" = none ] || fail "FSDP_MPI_SINGLE_COPY=none was not used"
expect_error "FSDP_MPI_SINGLE_COPY must be cma, none or auto, got 'xpmem'" env FSDP_MPI_SINGLE_COPY=xpmem "$run" -n 2 -- true
mkdir -p "$work/forbidden"
cp "$run" "$work/forbidden/fsdp-run"
printf '#!/bin/sh\necho "process_vm_readv: Operation not permitted" >&2\nexit 1\n' > "$work/forbidden/fsdp-cma-probe"
chmod +x "$work/forbidden/fsdp-cma-probe"
[ "$(mechanism "$work/forbidden/fsdp-run")" = none ] || fail "a failing probe did not give plain copies"
rm "$work/forbidden/fsdp-cma-probe"
[ "$(mechanism "$work/forbidden/fsdp-run")" = none ] || fail "a missing probe did not give plain copies"
# Both mechanisms move the same bytes: the same losses, bit for bit.
if [ "$allowed" = cma ]; then
  FSDP_MPI_SINGLE_COPY=none train_run plain 2 --preset tiny --steps 3 --strategy full_shard
  FSDP_MPI_SINGLE_COPY=cma train_run cma 2 --preset tiny --steps 3 --strategy full_shard
  same_losses "$work/plain.jsonl" "$work/cma.jsonl" 3
else
  echo "note: this machine forbids Cross Memory Attach ($("$build/fsdp-cma-probe" 2>&1)); the cma run is skipped"
fi
# The trainer sees those threads.
train_run one 1 --preset tiny --steps 1
json_is "$work/one.json" .threads_per_rank "$(nproc)"
pass
