#!/usr/bin/env bash
# The preflight: a run whose planned host memory (ranks of this host x the
# planner's per-rank need) exceeds what the host has is refused at once,
# before anything is allocated, with the figures and the settings that
# would fit; --no-preflight runs it anyway. FSDP_PREFLIGHT_AVAILABLE_BYTES
# stands in for a smaller machine.
source "$(dirname "$0")/lib.sh" "$@"

# The xl preset (1.48 B parameters) on 4 ranks of this 24 GiB machine: it
# would be killed while building the model; it is refused in seconds.
start=$(date +%s)
expect_error "preflight: this run needs about" "$run" -n 4 -- "$train" --preset xl --steps 1
expect_error "--sharded-init --activation-checkpointing:" "$run" -n 4 -- "$train" --preset xl --steps 1
[ $(( $(date +%s) - start )) -lt 60 ] || fail "the refusals took $(( $(date +%s) - start )) s"

# small on 2 ranks needs about 370 MiB per rank: refused on a 500 MB host,
# with the variants' figures; runs on a 1 GB one, and with --no-preflight.
FSDP_PREFLIGHT_AVAILABLE_BYTES=500000000 expect_error "rank(s) here" "$run" -n 2 -- "$train" --preset small --steps 1
FSDP_PREFLIGHT_AVAILABLE_BYTES=500000000 expect_error "but the host has 476.84 MiB available" \
  "$run" -n 2 -- "$train" --preset small --steps 1
FSDP_PREFLIGHT_AVAILABLE_BYTES=1000000000 train_run fits 2 --preset small --steps 1
FSDP_PREFLIGHT_AVAILABLE_BYTES=500000000 train_run forced 2 --preset small --steps 1 --no-preflight
pass
