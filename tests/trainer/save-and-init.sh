#!/usr/bin/env bash
# --save-final writes the spec's names; --init-from reads them back
# exactly: a model started from saved weights holds them bit for bit, and a
# model started from the trained weights continues where training ended.
#
# Reading the weights back: --init-from, then one step at --lr 1e-50, then
# --save-final. AdamW moves each weight by lr / (1 - beta1) * m / (sqrt(v) +
# eps), multiplied in as an fp32 scalar: 1e-49 rounds to 0 in fp32, so the
# step changes no bit (weight decay is 0) and the file written holds the
# weights as loaded.
source "$(dirname "$0")/lib.sh" "$@"

train_run a 2 --preset tiny --steps 3 --save-final "$work/final.safetensors"
require_step_numbers "$work/a.jsonl" 1 3
[ -s "$work/final.safetensors" ] || fail "no weights written"
safetensors_header "$work/final.safetensors" > "$work/final.header.json" || fail "final.safetensors has no header"
for name in transformer.wte.weight transformer.wpe.weight transformer.h.1.mlp.c_proj.bias transformer.ln_f.weight; do
  json_ok "$work/final.header.json" "has(\"$name\")" "saved file lacks $name"
done
json_ok "$work/final.header.json" 'has("lm_head.weight") | not' "the tied head was saved twice"
# Loaded on 3 ranks (every tiny unit padded there) and saved again: the same tensors.
train_run b 3 --preset tiny --steps 1 --lr 1e-50 --init-from "$work/final.safetensors" --save-final "$work/again.safetensors"
require_steps "$work/b.jsonl" 1
same_safetensors "$work/again.safetensors" "$work/final.safetensors"
# The fixed point is not the seed's: the same step from a fresh model writes other weights.
train_run c 3 --preset tiny --steps 1 --lr 1e-50 --save-final "$work/fresh.safetensors"
require_steps "$work/c.jsonl" 1
( same_safetensors "$work/fresh.safetensors" "$work/final.safetensors" ) >/dev/null 2>&1 &&
  fail "a fresh model saved the trained weights: the comparison sees nothing"
# From the trained weights, step 1's loss is below a fresh model's.
awk -v a="$(losses "$work/b.jsonl")" -v b="$(losses "$work/c.jsonl")" 'BEGIN { exit !(a < b - 0.05) }' ||
  fail "loss from the saved weights ($(losses "$work/b.jsonl")) is not below a fresh start's ($(losses "$work/c.jsonl"))"

# Mixed precision saves the fp32 masters, under the same names, and loads
# them as they are (not rounded through bf16).
train_run bf16 2 --preset tiny --steps 2 --param-dtype bf16 --strategy zero1 --save-final "$work/bf16.safetensors"
json_is "$work/bf16.json" '[.param_dtype, .strategy] | @csv' '"bf16","zero1"'
safetensors_header "$work/bf16.safetensors" > "$work/bf16.header.json" || fail "bf16.safetensors has no header"
json_is "$work/bf16.header.json" '.["transformer.wte.weight"].dtype' F32
json_is "$work/bf16.header.json" '[keys[] | select(. != "__metadata__")] | length' \
  "$(jq '[keys[] | select(. != "__metadata__")] | length' "$work/final.header.json")"
train_run reload 1 --preset tiny --steps 1 --lr 1e-50 --param-dtype bf16 --init-from "$work/bf16.safetensors" \
  --save-final "$work/bf16-again.safetensors"
require_steps "$work/reload.jsonl" 1
same_safetensors "$work/bf16-again.safetensors" "$work/bf16.safetensors"
pass
