#!/usr/bin/env bash
# fsdp::FusedAdamW against torch::optim::AdamW on one 100-million-element
# float32 shard (issue 15's case), alternating steps in one run:
#   bash bench/adamw.sh [BUILD_DIR] [ELEMENTS] [ROUNDS]
# Prints the JSON line of fsdp-bench-adamw (median s/step of each, speed-up,
# the fused pass's GB/s, the two results' norm-relative difference).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
"$build/fsdp-bench-adamw" --elements "${2:-100000000}" --rounds "${3:-5}" --threads "$(nproc)"
