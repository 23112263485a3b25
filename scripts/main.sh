#!/usr/bin/env bash
# The main job: set up, build, and train the reference GPT (preset small,
# 100 steps) with FULL_SHARD on 2 local ranks on the built-in corpus; then the
# trained model writes a sample and rank 0 prints the summary.
# Extra arguments go to fsdp-train, e.g.  scripts/main.sh --steps 300
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh
kind="${FSDP_LIBTORCH_KIND:-$default_libtorch_kind}"
bash scripts/setup.sh "$kind"
build="$(build_dir "$kind")"
sample=(--sample 160)
for arg in "$@"; do [[ "$arg" == --sample* ]] && sample=(); done
exec "$build/fsdp-run" -n "${FSDP_RANKS:-2}" -- "$build/fsdp-train" --log "$build/train.jsonl" "${sample[@]}" "$@"
