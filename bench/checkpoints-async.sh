#!/usr/bin/env bash
# Asynchronous checkpoints (--ckpt-async) against synchronous ones, in one
# run, the variants alternating round by round: per save, the time training
# was blocked (synchronous: the whole save; async: waiting for the save
# before, if any, and the staging copy), and the step time with a background
# write in flight and without one (fp32, the preset's batch, the trainer's
# own figures: the log's step_s, checkpoint_blocked_s, checkpoint_in_flight).
#   bench/checkpoints-async.sh [OUTDIR]
# Environment:
#   PRESET (large), WORLD (2), STEPS (8), EVERY (2: a save every 2 steps and
#   after the last), FORMAT (sharded), ROUNDS (2), BIN (build)
# Take the measurement lock: flock /tmp/fsdp-measure.lock bench/checkpoints-async.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/checkpoints-async}"
preset="${PRESET:-large}" world="${WORLD:-2}" steps="${STEPS:-8}" every="${EVERY:-2}"
format="${FORMAT:-sharded}" rounds="${ROUNDS:-2}" bin="${BIN:-build}"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for variant in sync async; do
    dir="$out/$variant-$round"
    rm -rf "$dir" && mkdir -p "$dir"
    flags=(); [ "$variant" = sync ] || flags=(--ckpt-async)
    "$bin/fsdp-run" -n "$world" -- "$bin/fsdp-train" --preset "$preset" --steps "$steps" --ckpt-every "$every" \
      --ckpt-keep 1 --ckpt-dir "$dir/ck" --ckpt-format "$format" "${flags[@]}" --log "$dir/log.jsonl" \
      --summary "$dir/summary.json" > "$dir/out.txt" 2>&1 || { cat "$dir/out.txt" >&2; exit 1; }
    ckpt_bytes=$(du -sb "$dir/ck/step-$steps" | cut -f1)
    echo "$ckpt_bytes" > "$dir/checkpoint_bytes"
    rm -rf "$dir/ck"
    echo "round $round $variant done" >&2
  done
done
# The figures, every round of a variant pooled (step 1 left out: warm-up).
median() { sort -g | awk 'NF { v[++n] = $1 } END { if (n == 0) print "-"; else printf "%.3f", (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }'; }
{
  echo "== $preset W=$world $format, $steps steps, a save every $every, $rounds alternating rounds ($(date -u +%F))"
  for variant in sync async; do
    logs=("$out/$variant"-*/log.jsonl)
    summaries=("$out/$variant"-*/summary.json)
    blocked=$(jq -r 'select(.checkpoint_blocked_s > 0) | .checkpoint_blocked_s' "${logs[@]}")
    in_flight=$(jq -r 'select(.step > 1 and .checkpoint_in_flight) | .step_s' "${logs[@]}")
    idle=$(jq -r 'select(.step > 1 and (.checkpoint_in_flight | not)) | .step_s' "${logs[@]}")
    gb=$(awk '{ s += $1 } END { printf "%.3f", s / NR / 1e9 }' "$out/$variant"-*/checkpoint_bytes)
    echo "-- $variant: checkpoint $gb GB; per save, training blocked (s): $(echo $blocked | tr '\n' ' ')"
    echo "   blocked median $(echo "$blocked" | median) s; step median $(echo "$idle" | median) s without a write in flight ($(echo "$idle" | wc -w) steps), $(echo "$in_flight" | median) s with one ($(echo "$in_flight" | wc -w) steps)"
    jq -r '.checkpoint | "   summary: saves \(.saves), blocked \(.blocked_s) s (max \(.blocked_max_s)), staging \(.staging_s) s of \(.staged_bytes / 1e9) GB (rank 0), waited \(.waited_s) s (\(.saves_waited) saves), background writes \(.background_write_s) s"' "${summaries[@]}"
  done
} | tee "$out/summary.txt"
