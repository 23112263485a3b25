#!/usr/bin/env bash
# The main job: set up, build, and train the reference GPT (preset small,
# 100 steps) with FULL_SHARD on 2 local ranks on the built-in corpus, in the
# shuffled order with clipping, a warmup-plus-cosine schedule, and the
# validation loss every 20 steps; then the trained model writes a sample and
# rank 0 prints the summary (with the final validation loss).
# Extra arguments go to fsdp-train, e.g.  scripts/main.sh --steps 300
# (one of the options below given there replaces the default here).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh
kind="${FSDP_LIBTORCH_KIND:-$default_libtorch_kind}"
bash scripts/setup.sh "$kind"
build="$(build_dir "$kind")"
# Defaults of the main job, each dropped when the caller gives that option.
declare -A defaults=([--sample]=160 [--lr-schedule]=cosine [--warmup-steps]=25 [--eval-every]=20)
for arg in "$@"; do unset "defaults[${arg%%=*}]" 2>/dev/null || true; done
extra=()
for option in "${!defaults[@]}"; do extra+=("$option" "${defaults[$option]}"); done
exec "$build/fsdp-run" -n "${FSDP_RANKS:-2}" -- "$build/fsdp-train" --log "$build/train.jsonl" "${extra[@]}" "$@"
