#!/usr/bin/env bash
# The FSDP-core figures: FULL_SHARD step time at W = 1 and W = 2 (small and
# medium; W = 1 both with the per-rank batch and with the same global batch),
# and per-rank model-state bytes of medium at W = 1, 2, 4 against
# 16 bytes x parameters / W. Variants alternate over ROUNDS rounds, as
# shared/spec/bench.md asks; medians over rounds and steps (first step of
# each run excluded).
#   bench/core_figures.sh [OUTDIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
rounds="${2:-2}"
mkdir -p "$out"
run=build/fsdp-run
train=build/fsdp-train

# variant name, ranks, preset, batch per rank, steps
variants=(
  "small_w1_b8 1 small 8 6"
  "small_w1_b16 1 small 16 6"
  "small_w2_b8 2 small 8 6"
  "medium_w1_b4 1 medium 4 4"
  "medium_w1_b8 1 medium 8 4"
  "medium_w2_b4 2 medium 4 4"
  "medium_w4_b4 4 medium 4 3"
)
[ "${SUMMARY_ONLY:-0}" = 1 ] || for round in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    read -r name ranks preset batch steps <<<"$v"
    echo "round $round: $name" >&2
    "$run" -n "$ranks" -- "$train" --preset "$preset" --batch "$batch" --steps "$steps" \
      --log "$out/${name}_r${round}.jsonl" > "$out/${name}_r${round}.out" 2>&1
  done
done

# A JSON field of every line of the given logs, one value per line.
field() { local name="$1"; shift; sed -n "s/.*\"$name\":\[*\([0-9.e+-]*\).*/\1/p" "$@"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# One line per variant: median step_s and tokens/s over the steps after the
# first, and rank 0's model_state_bytes and largest peak_tensor_bytes.
printf "%-14s %5s %10s %12s %16s %16s\n" variant ranks step_s tokens_per_s model_state_B peak_tensor_B
for v in "${variants[@]}"; do
  read -r name ranks preset batch steps <<<"$v"
  logs=("$out/${name}"_r*.jsonl)
  later=$(grep -hv '"step":1,' "${logs[@]}")
  printf "%-14s %5d %10.3f %12.0f %16d %16d\n" "$name" "$ranks" \
    "$(field step_s <<<"$later" | median)" "$(field tokens_per_s <<<"$later" | median)" \
    "$(field model_state_bytes "${logs[@]}" | tail -1)" "$(field peak_tensor_bytes "${logs[@]}" | sort -g | tail -1)"
done | tee "$out/summary.txt"
