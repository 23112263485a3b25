#!/usr/bin/env bash
# The two LibTorches side by side: the same fsdp-train commands built against
# each (Debian's 1.13 in build/, PyPI's wheel in build-wheel/), alternating
# in one run, so that the machine's drift hits both alike. Per preset and
# strategy: the median step time (after the first step) and the peak RSS.
#   bench/libtorch.sh [--presets "medium large"] [--strategies "full_shard no_shard"] [--steps S] [--rounds R] [--out DIR]
# Every run is W = 2 ranks, each with cores / 2 threads, the preset's batch.
set -euo pipefail
cd "$(dirname "$0")/.."
presets="medium large" strategies="full_shard no_shard" steps=4 rounds=2 out=bench/results/libtorch
builds="build-wheel build"
while [ $# -gt 0 ]; do
  case "$1" in
    --presets) presets="$2"; shift 2 ;;
    --strategies) strategies="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --builds) builds="$2"; shift 2 ;;
    *) echo "bench/libtorch.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
version() { sed -n 's/^-- fsdp-cpp: LibTorch \([^ ]*\) .*/\1/p' "$1.log" 2>/dev/null | tail -1; }
for round in $(seq 1 "$rounds"); do
  for preset in $presets; do
    for strategy in $strategies; do
      for build in $builds; do
        echo "round $round: $preset $strategy, $build (LibTorch $(version "$build"))" >&2
        "$build/fsdp-run" -n 2 -- "$build/fsdp-train" --preset "$preset" --steps "$steps" --strategy "$strategy" \
          --print-every "$steps" --summary "$out/summary.json" > "$out/last.out" 2>&1 || { cat "$out/last.out" >&2; exit 1; }
        jq -c --arg build "$build" --arg libtorch "$(version "$build")" --argjson round "$round" \
          '{build: $build, libtorch: $libtorch, round: $round, preset, strategy, step_s, peak_rss_bytes, tokens_per_s}' \
          "$out/summary.json" >> "$results"
      done
    done
  done
done
# The table: medians over rounds; the RSS is the larger rank's.
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by([.preset, .strategy, .libtorch]) | map({preset: .[0].preset, strategy: .[0].strategy, libtorch: .[0].libtorch,
    step_s: (map(.step_s) | median), rss_gib: (map(.peak_rss_bytes | max) | median / 1073741824),
    runs: (map(.step_s) | map(. * 1000 | round / 1000))})
  | (["preset", "strategy", "LibTorch", "median step s", "peak RSS GiB", "step s per round"] | @tsv),
    (.[] | [.preset, .strategy, .libtorch, (.step_s * 1000 | round / 1000), (.rss_gib * 100 | round / 100), (.runs | map(tostring) | join(" "))] | @tsv)' \
  "$results" | column -t -s $'\t'
