# The learning-rate schedule, weight decay and clipping of fsdp-train: the
# log's lr of every step is the spec's formula (warmup, then cosine to
# --min-lr at the last step; warmup then constant); a run resumed mid-cosine
# (with weight decay and the default clipping) repeats the uninterrupted
# one bit for bit, lr included; a resume that asks for another schedule is
# refused; clipping is on at 1.0 by default, its norm in every record, and
# --clip-grad-norm 0 turns it off; weight decay changes the training.

make_text_data
common=(--preset tiny --data "$work/data.txt")

# lr_follows LOG KIND LR WARMUP MIN_LR S: every record's lr is the formula's
# (relative 1e-12), computed here by awk.
lr_follows() {
  jq -r '"\(.step) \(.lr)"' "$1" | awk -v kind="$2" -v lr="$3" -v w="$4" -v min="$5" -v S="$6" '
    { s = $1 - 1; pi = atan2(0, -1)
      if (s < w) want = lr * (s + 1) / w
      else if (kind == "constant") want = lr
      else want = min + 0.5 * (lr - min) * (1 + cos(pi * (s - w) / (S - 1 - w)))
      d = $2 - want; if (d < 0) d = -d
      if (d > 1e-12 * want) { printf "step %d: lr %s, the formula %.17g\n", $1, $2, want; bad = 1 } }
    END { exit bad }' || fail "$(basename "$1"): the lr is not the $2 schedule's"
  echo "ok: $(basename "$1"): lr of every step = the $2 formula"
}

# Cosine with warmup, stopped at step 5 of 10 and resumed.
cosine=("${common[@]}" --lr 2e-3 --lr-schedule cosine --warmup-steps 3 --min-lr 1e-4 --weight-decay 0.1)
train_run straight 2 "${cosine[@]}" --steps 10 --ckpt-dir "$work/ck" --ckpt-every 5
require_step_numbers "$work/straight.jsonl" 1 10
lr_follows "$work/straight.jsonl" cosine 2e-3 3 1e-4 10
log_is "$work/straight.jsonl" '.[9].lr' 0.0001
log_ok "$work/straight.jsonl" '[.[3:][].lr] | . == (sort | reverse)' "the cosine does not decay"
log_ok "$work/straight.jsonl" 'all(.grad_norm | type == "number")' "clipping (on by default) logs no grad_norm"
json_is "$work/ck/step-5/metadata.json" '.extra.lr_schedule | [.kind, .warmup_steps, .total_steps] | @csv' '"cosine",3,10'
json_is "$work/ck/step-5/metadata.json" .extra.weight_decay 0.1
rm -rf "$work/ck/step-10"
train_run resumed 2 "${cosine[@]}" --steps 10 --ckpt-dir "$work/ck" --resume
json_is "$work/resumed.json" .first_step 5
require_step_numbers "$work/resumed.jsonl" 6 10
log_steps "$work/straight.jsonl" 6 10 > "$work/straight-6-10.jsonl"
same_losses "$work/resumed.jsonl" "$work/straight-6-10.jsonl" 5
[ "$(jq -c '[.lr, .grad_norm]' "$work/resumed.jsonl")" = "$(jq -c '[.lr, .grad_norm]' "$work/straight-6-10.jsonl")" ] ||
  fail "the resumed run's lr or grad norm differ from the uninterrupted run's"
echo "ok: resumed mid-schedule bit for bit (loss, lr, grad norm)"

# Another schedule on resume is refused: a cosine's length is part of it.
rm -rf "$work/ck/step-10"
expect_error "was trained with the learning-rate schedule 'cosine from 0.002 to 0.0001 over 10 steps" \
  "$run" -n 2 -- "$train" "${cosine[@]}" --steps 12 --ckpt-dir "$work/ck" --resume
expect_error "this run asks for 'constant 0.002, 3 warmup steps'" \
  "$run" -n 2 -- "$train" "${common[@]}" --steps 10 --lr 2e-3 --warmup-steps 3 --ckpt-dir "$work/ck" --resume

# Warmup, then constant; without clipping no grad norm is logged.
train_run constant 1 "${common[@]}" --steps 6 --lr 1e-3 --warmup-steps 4 --clip-grad-norm 0
lr_follows "$work/constant.jsonl" constant 1e-3 4 0 6
log_ok "$work/constant.jsonl" 'all(has("grad_norm") | not)' "--clip-grad-norm 0 still logs a grad norm"

# --weight-decay reaches the optimizer: the same run with decay 1.0 ends
# elsewhere (by a little over 6 steps at lr 1e-3); its first loss is that of
# the initial weights, before any decay. (The decay's math:
# WeightDecay.OfMatricesOnlyEqualsAdamWWithTwoParameterGroups.)
train_run decay 1 "${common[@]}" --steps 6 --lr 1e-3 --warmup-steps 4 --clip-grad-norm 0 --weight-decay 1.0
[ "$(losses "$work/constant.jsonl" | tail -1)" != "$(losses "$work/decay.jsonl" | tail -1)" ] ||
  fail "--weight-decay 1.0 trained the same model as none"
[ "$(losses "$work/constant.jsonl" | head -1)" = "$(losses "$work/decay.jsonl" | head -1)" ] ||
  fail "the first step's loss depends on --weight-decay"

expect_error "unknown learning-rate schedule 'linear': expected one of constant, cosine" "$run" -n 1 -- "$train" "${common[@]}" --steps 2 --lr-schedule linear
expect_error "--min-lr needs --lr-schedule cosine" "$run" -n 1 -- "$train" "${common[@]}" --steps 2 --min-lr 1e-4
expect_error "warmup_steps < total_steps" "$run" -n 1 -- "$train" "${common[@]}" --steps 2 --lr-schedule cosine --warmup-steps 2
expect_error "--weight-decay must be >= 0" "$run" -n 1 -- "$train" "${common[@]}" --steps 2 --weight-decay -1
