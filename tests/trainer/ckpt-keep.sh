#!/usr/bin/env bash
# --ckpt-keep N: after several saves, exactly the newest N complete
# checkpoints are on disk, each verifying; resuming from the newest
# continues the uninterrupted run bit for bit, and its saves prune the
# first run's checkpoints too.
source "$(dirname "$0")/lib.sh" "$@"

common=(--preset tiny --ckpt-every 1 --ckpt-keep 3 --ckpt-dir "$work/ck")
# checkpoints: the step-N entries of the folder, in step order, on one line.
checkpoints() { ls "$work/ck" | sort -t- -k2 -n | paste -sd' '; }
train_run straight 2 --preset tiny --steps 10
train_run kept 2 "${common[@]}" --steps 7
[ "$(checkpoints)" = "step-5 step-6 step-7" ] || fail "after 7 saves with --ckpt-keep 3: $(checkpoints)"
for step in 5 6 7; do "$build/fsdp-ckpt" verify "$work/ck/step-$step" >/dev/null || fail "step-$step does not verify"; done
train_run kept 2 "${common[@]}" --steps 10 --resume
json_is "$work/kept.json" .resumed_from "$work/ck/step-7"
[ "$(checkpoints)" = "step-8 step-9 step-10" ] || fail "after resuming to step 10 with --ckpt-keep 3: $(checkpoints)"
require_step_numbers "$work/kept.jsonl" 1 10
same_losses "$work/kept.jsonl" "$work/straight.jsonl" 10
# --ckpt-keep 1: the last save alone.
train_run one 2 --preset tiny --steps 2 --ckpt-every 1 --ckpt-keep 1 --ckpt-dir "$work/ck1"
[ "$(ls "$work/ck1" | paste -sd' ')" = "step-2" ] || fail "with --ckpt-keep 1: $(ls "$work/ck1" | paste -sd' ')"
pass
