#!/usr/bin/env bash
# --reduce-dtype fp16, with fp32 and with bf16 parameters: gradients cross
# the ranks in fp16 (half the reduce-scatter bytes of fp32), under dynamic
# loss scaling (the log's loss_scale and skipped), and training follows the
# same run with fp32 reductions.
#
# The data repeats (in the sequential order, with no validation split): 36
# bytes at context 31 hold 4 sequences, and each step's
# global batch (2 ranks x 2) is those 4, rank 0 two of them and rank 1 the
# other two. So a step skipped on overflow would shift the run without
# changing it (on the default corpus the first step overflows at the
# initial scale, 65536): the fp16 run's first k + 1 losses are then one
# figure, and its steps k + 1 .. 10 follow the fp32 run's 1 .. 10 - k.
#
# Tolerances, about 10x the differences measured (relative, worst over the
# steps; deterministic): fp16 keeps 11 significant bits, and Adam divides
# most of the rounding out of each update. fp32 parameters: losses 1.4e-6,
# gradient norms 3.5e-5; allowed 1e-5 and 3e-4. bf16 parameters, whose
# forward rounds far more (8 bits) and amplifies any difference: losses
# 1.7e-4, norms 2.8e-3; allowed 2e-3 and 3e-2. A gradient left scaled
# (65536x), averaged twice or summed (2x) shows in the norms; one reduced
# in the wrong dtype, in the bytes.
source "$(dirname "$0")/lib.sh" "$@"

yes 'the ranks reduce their gradients in fp16. ' | head -c 36 > "$work/four.txt"
common=(--preset tiny --context 31 --steps 10 --batch 2 --data "$work/four.txt" --clip-grad-norm 1000
        --data-order sequential --val-fraction 0)
declare -A loss_tol=([fp32]=1e-5 [bf16]=2e-3) norm_tol=([fp32]=3e-4 [bf16]=3e-2)
for params in fp32 bf16; do
  train_run "$params-fp32" 2 "${common[@]}" --param-dtype "$params" --reduce-dtype fp32
  train_run "$params-fp16" 2 "${common[@]}" --param-dtype "$params" --reduce-dtype fp16
  json_is "$work/$params-fp16.json" .param_dtype "$params"
  json_is "$work/$params-fp16.json" .reduce_dtype fp16
  json_is "$work/$params-fp32.json" .reduce_dtype fp32
  require_steps "$work/$params-fp16.jsonl" 10
  require_steps "$work/$params-fp32.jsonl" 10
  # Loss scaling is on with fp16 reductions, and only with them.
  log_ok "$work/$params-fp16.jsonl" 'all(.loss_scale > 1 and (.skipped | type == "boolean"))' "$params-fp16: not loss-scaled"
  log_ok "$work/$params-fp32.jsonl" 'all(has("loss_scale") or has("skipped") | not)' "$params-fp32: loss-scaled without fp16"
  # fp16 reductions move 2 bytes an element, fp32 ones 4.
  paste <(jq '.comm_bytes.reduce_scatter' "$work/$params-fp16.jsonl") <(jq '.comm_bytes.reduce_scatter' "$work/$params-fp32.jsonl") |
    awk '{ if ($1 <= 0 || 2 * $1 != $2) { printf "step %d: fp16 reduce-scattered %s bytes, fp32 %s\n", NR, $1, $2; bad = 1 } }
         END { exit bad || NR != 10 }' || fail "$params: the fp16 reduction does not move half the bytes of fp32"
  # The skipped steps: the first k, no more than 3, each halving the scale.
  k=$(jq -s '[.[] | .skipped] | index(false)' "$work/$params-fp16.jsonl")
  [ "$k" != null ] && [ "$k" -le 3 ] || fail "$params-fp16: $k leading steps skipped"
  log_ok "$work/$params-fp16.jsonl" "(.[$k:] | all(.skipped == false)) and .[$k].loss_scale == 65536 / pow(2; $k)" \
    "$params-fp16: skipped steps after the first $k, or a scale other than 65536 / 2^$k"
  log_ok "$work/$params-fp16.jsonl" "[.[:$k + 1][].loss] | unique | length == 1" "$params-fp16: a skipped step changed the weights"
  echo "$params: $k step(s) skipped on overflow, then loss scale $(jq -s ".[$k].loss_scale" "$work/$params-fp16.jsonl")"
  jq -c "select(.step > $k)" "$work/$params-fp16.jsonl" > "$work/$params-fp16.kept.jsonl"
  jq -c "select(.step <= 10 - $k)" "$work/$params-fp32.jsonl" > "$work/$params-fp32.kept.jsonl"
  compare_losses "$work/$params-fp16.kept.jsonl" "$work/$params-fp32.kept.jsonl" "${loss_tol[$params]}" $(( 10 - k ))
  for name in "$params-fp16.kept" "$params-fp32.kept"; do jq -c '{loss: .grad_norm}' "$work/$name.jsonl" > "$work/$name.norms.jsonl"; done
  compare_losses "$work/$params-fp16.kept.norms.jsonl" "$work/$params-fp32.kept.norms.jsonl" "${norm_tol[$params]}" $(( 10 - k ))
done
pass
