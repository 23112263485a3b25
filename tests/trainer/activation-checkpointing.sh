#!/usr/bin/env bash
# Recomputing each block in backward: the same losses bit for bit, the same
# bytes all-gathered (the recompute uses the parameters backward gathered,
# it does not gather again), and a lower peak. Units per attention and per
# MLP (--wrap sublayer) train the same model too: same losses bit for bit
# (at W = 2 each averaged element is the same two numbers whatever the
# unit), twice the block units (tiny: 2 blocks; the root is a unit too).
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
common=(--preset tiny --steps 4 --batch 8 --data "$work/data.txt")
train_run off 2 "${common[@]}"
train_run on 2 "${common[@]}" --activation-checkpointing --forward-prefetch
train_run sublayer 2 "${common[@]}" --activation-checkpointing --wrap sublayer
json_is "$work/off.json" '[.activation_checkpointing, .forward_prefetch, .wrap, .units] | @csv' 'false,false,"block",3'
json_is "$work/on.json" '[.activation_checkpointing, .forward_prefetch, .wrap, .units] | @csv' 'true,true,"block",3'
json_is "$work/sublayer.json" '[.activation_checkpointing, .wrap, .units] | @csv' 'true,"sublayer",5'
same_losses "$work/on.jsonl" "$work/off.jsonl" 4
same_losses "$work/sublayer.jsonl" "$work/off.jsonl" 4
expect_error "--wrap must be block or sublayer, got 'layer'" "$run" -n 2 -- "$train" --preset tiny --wrap layer
# All-gathered bytes per step, every step: the same with recompute as without.
for f in off on; do jq -c '.comm_bytes.all_gather' "$work/$f.jsonl" > "$work/$f.gathered"; done
log_ok "$work/off.jsonl" 'all(.comm_bytes.all_gather > 0)' "off.jsonl: a step gathered nothing"
cmp -s "$work/on.gathered" "$work/off.gathered" ||
  fail "all-gather bytes per step differ: $(paste -sd, "$work/on.gathered") with recompute, $(paste -sd, "$work/off.gathered") without"
peak() { jq -r '.peak_tensor_bytes[0]' "$1"; }
echo "peak tensor bytes: $(peak "$work/off.json") without, $(peak "$work/on.json") with activation checkpointing"
json_ok "$work/on.json" ".peak_tensor_bytes[0] < $(peak "$work/off.json")" "activation checkpointing did not lower the peak"
pass
