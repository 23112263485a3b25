#!/usr/bin/env bash
# Built without memory for its weights and initialized unit by unit: the
# same model (bitwise the same losses), a lower construction peak.
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
train_run off 2 --preset small --steps 2 --batch 1 --data "$work/data.txt"
train_run on 2 --preset small --steps 2 --batch 1 --data "$work/data.txt" --sharded-init
same_losses "$work/on.jsonl" "$work/off.jsonl" 2
built() { jq -r '.construction_peak_bytes' "$1"; }
echo "construction peak: $(built "$work/off.json") B built whole, $(built "$work/on.json") B with sharded initialization"
json_ok "$work/on.json" ".construction_peak_bytes > 0 and .construction_peak_bytes < $(built "$work/off.json")" \
  "sharded initialization did not lower the construction peak"
expect_error "--sharded-init draws the initial weights unit by unit; it cannot be combined with --init-from" \
  "$run" -n 2 -- "$train" --preset tiny --sharded-init --init-from "$work/x.safetensors"
pass
