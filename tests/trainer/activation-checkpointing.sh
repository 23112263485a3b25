#!/usr/bin/env bash
# Recomputing each block in backward: the same losses bit for bit, the same
# bytes all-gathered (the recompute uses the parameters backward gathered,
# it does not gather again), a lower peak, and one block's full-size
# gradient alive at a time besides the root's. Units per attention and per
# MLP (--wrap sublayer) train the same model too: same losses bit for bit
# (at W = 2 each averaged element is the same two numbers whatever the
# unit), twice the block units (tiny with 4 blocks; the root is a unit too).
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
common=(--preset tiny --layers 4 --steps 4 --batch 8 --data "$work/data.txt")
train_run off 2 "${common[@]}"
train_run on 2 "${common[@]}" --activation-checkpointing --forward-prefetch
train_run sublayer 2 "${common[@]}" --activation-checkpointing --wrap sublayer
json_is "$work/off.json" '[.activation_checkpointing, .forward_prefetch, .wrap, .units] | @csv' 'false,false,"block",5'
json_is "$work/on.json" '[.activation_checkpointing, .forward_prefetch, .wrap, .units] | @csv' 'true,true,"block",5'
json_is "$work/sublayer.json" '[.activation_checkpointing, .wrap, .units] | @csv' 'true,"sublayer",9'
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
# Rank 0's gathered and gradient buffers at the last step's peak, in units
# (sizes from fsdp-plan, padded to the 2 ranks): the root's parameters and
# gradient buffer, the recomputed block's parameters and gradient buffer,
# and the block prefetched ahead: the previous block's reduction finished
# before this block's gradient buffer was made. Without checkpointing that
# reduction may still be in flight: up to one block more.
"$build/fsdp-plan" --preset tiny --layers 4 --world 2 --json > "$work/plan.json" || fail "fsdp-plan failed"
units() { jq "def padded: (. + 1) / 2 | floor * 2 * 4; (.model.unit_numels | map(padded)) as \$u | $1" "$work/plan.json"; }
one_gradient=$(units '2 * $u[0] + 3 * ($u[1:] | max)')
unsharded() { jq -r '.last_step_peak_by_category_rank0.unsharded_buffers' "$1"; }
echo "unsharded buffers at the peak: $(unsharded "$work/on.json") B with activation checkpointing (expected $one_gradient B)," \
     "$(unsharded "$work/off.json") B without"
json_ok "$work/on.json" ".last_step_peak_by_category_rank0.unsharded_buffers == $one_gradient" \
  "with activation checkpointing the gathered and gradient buffers peaked at $(unsharded "$work/on.json") B, not $one_gradient B (the root's and one block's parameters and gradients, one block prefetched)"
json_ok "$work/off.json" ".last_step_peak_by_category_rank0.unsharded_buffers <= $(units '2 * $u[0] + 4 * ($u[1:] | max)')" \
  "without activation checkpointing the gathered and gradient buffers peaked at $(unsharded "$work/off.json") B"
pass
