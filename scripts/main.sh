#!/usr/bin/env bash
# The main job: set up, build, and train the reference GPT (preset small,
# 100 steps) with FULL_SHARD on 2 local ranks on the built-in corpus.
# Extra arguments go to fsdp-train, e.g.  scripts/main.sh --steps 300
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec build/fsdp-run -n "${FSDP_RANKS:-2}" -- build/fsdp-train --log build/train.jsonl "$@"
