#!/usr/bin/env bash
# Every strategy on one preset at W = 2 and W = 4, back to back in one run:
# per-rank model state measured against the formula, bytes per collective
# kind in one step (counted by the communicator), and median step time
# (first step excluded). Hybrid runs use nodes of 2 ranks at W = 4 and of 1
# rank at W = 2 (two nodes either way).
#   bench/strategies.sh [PRESET] [STEPS] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-medium}"
steps="${2:-3}"
out="${3:-bench/results/strategies}"
mkdir -p "$out"
strategies=(no_shard zero1 shard_grad_op full_shard hybrid_shard hybrid_shard_zero2)

field() { sed -n "s/.*\"$1\":\\[*\\([0-9.e+-]*\\).*/\\1/p"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for world in 2 4; do
  per_node=$(( world / 2 ))
  for s in "${strategies[@]}"; do
    echo "W=$world $s" >&2
    build/fsdp-run -n "$world" --ranks-per-node "$per_node" -- build/fsdp-train --preset "$preset" --steps "$steps" \
      --strategy "$s" --log "$out/${s}_w${world}.jsonl" > "$out/${s}_w${world}.out" 2>&1
  done
done

printf "%-20s %2s %14s %14s %14s %14s %14s %8s\n" strategy W model_state_B formula_B all_gather_B reduce_scat_B all_reduce_B step_s
for world in 2 4; do
  for s in "${strategies[@]}"; do
    log="$out/${s}_w${world}.jsonl"
    # The formula, from the unit sizes the banner of the run reports.
    formula=$(sed -n 's/.*by formula: \([0-9]*\) B.*/\1/p' "$out/${s}_w${world}.out")
    last=$(tail -1 "$log")
    printf "%-20s %2d %14s %14s %14s %14s %14s %8.3f\n" "$s" "$world" "$(field model_state_bytes <<<"$last")" "$formula" \
      "$(field all_gather <<<"$last")" "$(field reduce_scatter <<<"$last")" "$(field all_reduce <<<"$last")" \
      "$(grep -v '"step":1,' "$log" | field step_s | median)"
  done
done | tee "$out/summary.txt"
