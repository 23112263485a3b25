# The shuffled data order and the validation loss: W = 2 trains the
# same model as W = 1 (training and validation losses), the order differs
# from the sequential one and with the seed, resume continues the same
# batches bit for bit, and bad splits are refused.

make_text_data
model=(--preset tiny --context 32 --data "$work/data.txt" --eval-every 3 --eval-sequences 8)
# The validation losses of a log as a log of losses, for compare_losses.
val_log() { jq -c 'select(.val_loss != null) | {loss: .val_loss}' "$work/$1.jsonl" > "$work/$1.val.jsonl"; }
declare -A batch=([1]=8 [2]=4)
for w in 1 2; do
  train_run "w$w" "$w" "${model[@]}" --steps 6 --batch "${batch[$w]}"
  val_log "w$w"
done
json_is "$work/w1.json" '[.data_order, .data_seed, .val_fraction, .eval_sequences] | @csv' '"shuffled",0,0.1,8'
log_is "$work/w1.jsonl" '[.[] | select(.val_loss != null) | .step] | @csv' '3,6'
json_is "$work/w2.json" .final_val_loss "$(jq -r .loss "$work/w2.val.jsonl" | tail -1)"
for w in 2; do
  compare_losses "$work/w$w.jsonl" "$work/w1.jsonl" 1e-5 6
  compare_losses "$work/w$w.val.jsonl" "$work/w1.val.jsonl" 1e-5 2
done

# Other orders give other batches: the sequential order, and another seed.
train_run seq 2 "${model[@]}" --steps 6 --batch 4 --data-order sequential
train_run seed1 2 "${model[@]}" --steps 6 --batch 4 --data-seed 1
json_is "$work/seed1.json" '[.data_order, .data_seed] | @csv' '"shuffled",1'
for other in seq seed1; do
  [ "$(losses "$work/$other.jsonl" | head -1)" != "$(losses "$work/w2.jsonl" | head -1)" ] ||
    fail "$other: the first step's loss equals the default order's"
done

# Resume: 3 steps, then resumed to 6, gives the straight run's training and
# validation losses bit for bit.
train_run first 2 "${model[@]}" --steps 3 --batch 4 --ckpt-dir "$work/ck"
train_run rest 2 "${model[@]}" --steps 6 --batch 4 --ckpt-dir "$work/ck" --resume
json_is "$work/rest.json" .first_step 3
cat "$work/first.jsonl" "$work/rest.jsonl" > "$work/resumed.jsonl"
val_log resumed
same_losses "$work/resumed.jsonl" "$work/w2.jsonl" 6
same_losses "$work/resumed.val.jsonl" "$work/w2.val.jsonl" 2
echo "ok: bitwise resume in the shuffled order"
# A resume in another order would continue with other batches: refused.
expect_error "was trained with data order {\"order\":\"shuffled\",\"seed\":0,\"val_fraction\":0.1} but this run asks for {\"order\":\"shuffled\",\"seed\":1," \
  "$run" -n 2 -- "$train" "${model[@]}" --steps 8 --batch 4 --ckpt-dir "$work/ck" --resume --data-seed 1

bad=("$run" -n 2 -- "$train" --preset tiny --context 32 --steps 1 --data "$work/data.txt")
expect_error "--val-fraction must be in [0, 1), got 1" "${bad[@]}" --val-fraction 1
expect_error "--val-fraction must be in [0, 1), got -0.5" "${bad[@]}" --val-fraction -0.5
expect_error "--eval-every 2 needs a validation split, but --val-fraction is 0" "${bad[@]}" --val-fraction 0 --eval-every 2
expect_error "--eval-sequences must be a positive multiple of the world size 2, got 3" "${bad[@]}" --eval-sequences 3
expect_error "unknown data order 'random': expected one of sequential, shuffled" "${bad[@]}" --data-order random
head -c 300 "$work/data.txt" > "$work/small.txt"
expect_error "holds out 30 of its 300 tokens, too few for one validation sequence: need at least context + 2 = 34" \
  "$run" -n 2 -- "$train" --preset tiny --context 32 --steps 1 --data "$work/small.txt"
