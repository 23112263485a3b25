#!/usr/bin/env bash
# ZeRO++'s options against plain full_shard on the accuracy that matters:
# the final validation loss of `small` after STEPS steps of the main job's
# schedule (scripts/main.sh: warmup 25, cosine, validation every 20), W = 4
# across 2 hosts (scripts/netns-hosts.sh, uncapped: the link only changes
# time), each option alone and all three together, one after another.
# Root only. JSON lines to stdout (one per variant, with the ratio to
# full_shard's loss), a table to stderr.
#   bench/convergence.sh BUILD_DIR [STEPS]
set -euo pipefail
build="$(cd "${1:?usage: bench/convergence.sh BUILD_DIR [STEPS]}" && pwd)"
steps="${2:-300}"
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/fsdp_bench_convergence.XXXXXX)
trap 'rm -rf "$work"' EXIT

FSDP_BENCH_WORK="$work" FSDP_BENCH_STEPS="$steps" "$here/../scripts/netns-hosts.sh" run 2 -- bash -c '
  set -euo pipefail
  build="$0"; work="$FSDP_BENCH_WORK"
  read -ra a <<< "$FSDP_NETNS_MPI_ARGS"; mpi=(); for x in "${a[@]}"; do mpi+=(--mpi-arg "$x"); done
  declare -A variants=(
    [full_shard]=""
    [qwz]="--gather-quantization int8"
    [hpz]="--secondary-partition"
    [qgz]="--gradient-quantization int8"
    [all]="--gather-quantization int8 --secondary-partition --gradient-quantization int8")
  for name in full_shard qwz hpz qgz all; do
    read -ra flags <<< "${variants[$name]}"
    OMP_NUM_THREADS=1 "$build/fsdp-run" -n 4 --host 10.88.0.1:2,10.88.0.2:2 "${mpi[@]}" -- "$build/fsdp-train" \
      --preset small --steps "$FSDP_BENCH_STEPS" --lr-schedule cosine --warmup-steps 25 --eval-every 20 \
      --strategy full_shard "${flags[@]}" --summary "$work/$name.json" > "$work/$name.out" 2>&1 ||
      { cat "$work/$name.out" >&2; exit 1; }
  done' "$build"

base=$(jq .final_val_loss "$work/full_shard.json")
for name in full_shard qwz hpz qgz all; do
  jq -c --arg variant "$name" --argjson base "$base" '{bench: "convergence", preset: .preset, steps: .steps,
    variant: $variant, final_val_loss: .final_val_loss, vs_full_shard: (.final_val_loss / $base),
    final_loss: .final_loss, step_s: .step_s}' "$work/$name.json"
done | tee "$work/lines.jsonl"
jq -r '"\(.variant)\t\(.final_val_loss)\t\(.vs_full_shard)"' "$work/lines.jsonl" |
  column -t -N variant,val_loss,vs_full_shard >&2
