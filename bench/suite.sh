#!/usr/bin/env bash
# The benchmark of shared/spec/bench.md: its variants back to back in one
# run, alternating over rounds, at an equal global batch and equal total
# threads (fsdp-run gives each rank cores / ranks). Writes one JSON object
# per variant and round (the trainer's --summary, with per-rank lists) to
# OUT/results.jsonl and prints a table of medians and ratios.
#   bench/suite.sh [--preset P] [--batch B] [--steps S] [--rounds R] [--out DIR] [--variants "V ..."] [--report]
# --report: only print the table of OUT/results.jsonl.
# B is the per-rank batch at W = 2 (even): local runs 2B, W = 4 runs B/2.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FSDP_BUILD:-build}"
preset=medium batch=2 steps=4 rounds=1 out=bench/results/suite report_only=0
variants="local no_shard no_shard_ac no_shard_bf16 zero1 shard_grad_op full_shard full_shard_noprefetch full_shard_ac full_shard_bf16 full_shard_lowmem no_shard_w4 full_shard_w4"
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --report) report_only=1; shift ;;
    *) echo "bench/suite.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $((batch % 2)) -eq 0 ] || { echo "bench/suite.sh: --batch must be even (W = 4 runs B/2)" >&2; exit 2; }

# variant -> "ranks trainer-flags..."
variant_args() {
  case "$1" in
    local) echo "1 --batch $((2 * batch)) --strategy no_shard" ;;
    no_shard|zero1|shard_grad_op) echo "2 --batch $batch --strategy $1" ;;
    no_shard_ac) echo "2 --batch $batch --strategy no_shard --activation-checkpointing" ;;
    no_shard_bf16) echo "2 --batch $batch --strategy no_shard --param-dtype bf16" ;;
    full_shard) echo "2 --batch $batch --strategy full_shard --forward-prefetch --backward-prefetch pre" ;;
    full_shard_noprefetch) echo "2 --batch $batch --strategy full_shard --backward-prefetch none" ;;
    full_shard_ac) echo "2 --batch $batch --strategy full_shard --forward-prefetch --activation-checkpointing" ;;
    full_shard_bf16) echo "2 --batch $batch --strategy full_shard --forward-prefetch --param-dtype bf16" ;;
    # The least memory: sublayer units, recomputed, nothing gathered ahead.
    full_shard_lowmem) echo "2 --batch $batch --strategy full_shard --activation-checkpointing --wrap sublayer --backward-prefetch none" ;;
    hybrid_shard) echo "4 --batch $((batch / 2)) --strategy hybrid_shard --ranks-per-node 2 --forward-prefetch" ;;
    no_shard_w4) echo "4 --batch $((batch / 2)) --strategy no_shard" ;;
    full_shard_w4) echo "4 --batch $((batch / 2)) --strategy full_shard --forward-prefetch" ;;
    *) echo "bench/suite.sh: unknown variant $1" >&2; return 1 ;;
  esac
}

mkdir -p "$out"
results="$out/results.jsonl"
[ "$report_only" = 1 ] || : > "$results"
[ "$report_only" = 1 ] && rounds=0
for round in $(seq 1 "$rounds"); do
  for v in $variants; do
    read -r ranks flags <<<"$(variant_args "$v")"
    echo "round $round: $v (W=$ranks $flags)" >&2
    # shellcheck disable=SC2086
    "$build/fsdp-run" -n "$ranks" -- "$build/fsdp-train" --preset "$preset" --steps "$steps" $flags \
      --print-every "$steps" --summary "$out/summary.json" > "$out/$v.r$round.out" 2>&1 ||
      { cat "$out/$v.r$round.out" >&2; exit 1; }
    jq -c --arg v "$v" --argjson round "$round" --argjson ranks "$ranks" \
      '{variant: $v, round: $round, oversubscribed: ($ranks > '"$(nproc)"')} + .' "$out/summary.json" >> "$results"
  done
done

# The table: medians over rounds; ratios to no_shard (W = 2) and to local.
jq -s -r '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by(.variant) | map({variant: .[0].variant, W: .[0].world_size, over: .[0].oversubscribed,
      step_s: (map(.step_s) | median), tokens_per_s: (map(.tokens_per_s) | median),
      exposed: (map(.exposed_comm_s) | median), peak: (map(.peak_tensor_bytes | max) | max),
      peak_predicted: .[0].peak_tensor_bytes_predicted,
      state: (.[0].model_state_bytes | max), predicted: .[0].model_state_bytes_predicted,
      rss: (map(.peak_rss_bytes | max) | max)}) as $rows
  | ($rows | map(select(.variant == "no_shard")) | .[0].step_s // null) as $ddp
  | ($rows | map(select(.variant == "local")) | .[0].step_s // null) as $local
  | ["variant", "W", "step_s", "tok/s", "x no_shard", "exposed comm", "scaling eff.", "peak tensors MiB (measured / planner)",
     "model state B (measured / planner)", "peak RSS MiB"],
    ($rows[] | [.variant, (.W | tostring) + (if .over then "*" else "" end), (.step_s * 1000 | round / 1000),
      (.tokens_per_s | round), (if $ddp then (.step_s / $ddp * 100 | round / 100) else "-" end),
      ((.exposed / .step_s * 1000 | round / 10 | tostring) + "%"),
      (if $local and .variant != "local" then ($local / .step_s * 100 | round | tostring) + "%" else "-" end),
      "\(.peak / 1048576 | round) / \(.peak_predicted / 1048576 | round)", "\(.state) / \(.predicted)",
      (.rss / 1048576 | round)])
  | @tsv' "$results" | column -t -s $'\t' | tee "$out/table.txt"
echo "(* oversubscribed: more ranks than the $(nproc) cores. Results: $results)"
