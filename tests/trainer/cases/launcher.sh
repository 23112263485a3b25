# fsdp-run: the exit status passes through, and threads per rank = cores /
# ranks; MPI yields the core while it waits; large messages use Cross Memory
# Attach exactly when fsdp-cma-probe says the machine allows it.

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
# Both mechanisms move the same bytes: launcher-cma.
# The trainer sees those threads.
train_run one 1 --preset tiny --steps 1
json_is "$work/one.json" .threads_per_rank "$(nproc)"
# Hosts: --host and --hostfile go to mpirun, -n defaults to the slots, no
# oversubscription, and each rank takes its own host's cores over the ranks there.
train_run on-host 2 --host localhost:2 -- --preset tiny --steps 2
json_is "$work/on-host.json" .world_size 2
json_is "$work/on-host.json" .threads_per_rank $(( $(env -u OMP_NUM_THREADS nproc) / 2 > 0 ? $(env -u OMP_NUM_THREADS nproc) / 2 : 1 ))
printf 'localhost slots=2\n' > "$work/hostfile"
"$run" --hostfile "$work/hostfile" -- "$train" --preset tiny --steps 2 --summary "$work/hostfile.json" > "$work/hostfile.out" 2>&1 ||
  { cat "$work/hostfile.out"; fail "--hostfile run failed"; }
json_is "$work/hostfile.json" .world_size 2
dry=$("$run" --hostfile "$work/hostfile" --dry-run -- "$train" --preset tiny)
grep -q -- "--hostfile $work/hostfile" <<<"$dry" && ! grep -q -- "--oversubscribe" <<<"$dry" ||
  fail "the dry run's mpirun command: $dry"
expect_error "give --hostfile or --host, not both" "$run" --hostfile "$work/hostfile" --host a:1 -- true
expect_error "--host wants host[:slots]" "$run" --host "a:x" -- true
expect_error "with hosts, nodes are the hosts" "$run" --host localhost:2 --ranks-per-node 1 -- true
expect_error "cannot read the hostfile" "$run" --hostfile "$work/none" -- true
