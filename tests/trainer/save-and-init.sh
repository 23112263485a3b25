#!/usr/bin/env bash
# --save-final writes the spec's names; --init-from reads them back, and a
# model started from the saved weights continues where training ended.
source "$(dirname "$0")/lib.sh" "$@"

train_run a 2 --preset tiny --steps 3 --save-final "$work/final.safetensors"
require_step_numbers "$work/a.jsonl" 1 3
[ -s "$work/final.safetensors" ] || fail "no weights written"
safetensors_header "$work/final.safetensors" > "$work/final.header.json" || fail "final.safetensors has no header"
for name in transformer.wte.weight transformer.wpe.weight transformer.h.1.mlp.c_proj.bias transformer.ln_f.weight; do
  json_ok "$work/final.header.json" "has(\"$name\")" "saved file lacks $name"
done
json_ok "$work/final.header.json" 'has("lm_head.weight") | not' "the tied head was saved twice"
train_run b 4 --preset tiny --steps 1 --init-from "$work/final.safetensors"
train_run c 4 --preset tiny --steps 1
require_steps "$work/b.jsonl" 1
require_steps "$work/c.jsonl" 1
# From the trained weights, step 1's loss is below a fresh model's.
awk -v a="$(losses "$work/b.jsonl")" -v b="$(losses "$work/c.jsonl")" 'BEGIN { exit !(a < b - 0.05) }' ||
  fail "loss from the saved weights ($(losses "$work/b.jsonl")) is not below a fresh start's ($(losses "$work/c.jsonl"))"

# Mixed precision saves the fp32 masters, under the same names.
train_run bf16 2 --preset tiny --steps 2 --param-dtype bf16 --strategy zero1 --save-final "$work/bf16.safetensors"
json_is "$work/bf16.json" '[.param_dtype, .strategy] | @csv' '"bf16","zero1"'
safetensors_header "$work/bf16.safetensors" > "$work/bf16.header.json" || fail "bf16.safetensors has no header"
json_is "$work/bf16.header.json" '.["transformer.wte.weight"].dtype' F32
json_is "$work/bf16.header.json" '[keys[] | select(. != "__metadata__")] | length' \
  "$(jq '[keys[] | select(. != "__metadata__")] | length' "$work/final.header.json")"
train_run reload 1 --preset tiny --steps 1 --init-from "$work/bf16.safetensors"
require_steps "$work/reload.jsonl" 1
pass
