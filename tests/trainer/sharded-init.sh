#!/usr/bin/env bash
# Built without memory for its weights and initialized unit by unit: the
# same model (bitwise the same losses), and a construction peak of the
# shards plus two units plus the root's parameters, which building the
# model whole exceeds.
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
train_run off 2 --preset small --steps 2 --batch 1 --data "$work/data.txt"
train_run on 2 --preset small --steps 2 --batch 1 --data "$work/data.txt" --sharded-init
same_losses "$work/on.jsonl" "$work/off.jsonl" 2
built() { jq -r '.construction_peak_bytes' "$1"; }
echo "construction peak: $(built "$work/off.json") B built whole, $(built "$work/on.json") B with sharded initialization"
# While a unit is built, its parameters (initialized) and their flattened
# copy are alive: two units at most. The root's parameters stay whole
# throughout: wte and wpe are the first parameters initialized, and the root
# unit is sharded last (its ln_f is the last parameter). With rank 0's shards
# (the summary's parameter bytes) that is the bound; unit sizes, padded to
# the 2 ranks, from fsdp-plan.
"$build/fsdp-plan" --preset small --world 2 --json > "$work/plan.json" || fail "fsdp-plan failed"
bound=$(jq --slurpfile s "$work/on.json" 'def padded: (. + 1) / 2 | floor * 2 * 4;
  (.model.unit_numels | map(padded)) as $u | $s[0].model_state_bytes_by_kind.params[0] + 2 * ($u[1:] | max) + $u[0]' \
  "$work/plan.json")
echo "bound: $bound B (the shards, two blocks, the root)"
json_ok "$work/on.json" ".construction_peak_bytes > 0 and .construction_peak_bytes <= $bound" \
  "sharded initialization peaked at $(built "$work/on.json") B, above the shards plus two units and the root ($bound B)"
json_ok "$work/off.json" ".construction_peak_bytes > $bound" "building the model whole kept within the bound: it measures nothing"
expect_error "--sharded-init draws the initial weights unit by unit; it cannot be combined with --init-from" \
  "$run" -n 2 -- "$train" --preset tiny --sharded-init --init-from "$work/x.safetensors"
pass
