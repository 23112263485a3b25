# Checkpoints through fsdp-train's --ckpt-dir, beyond what the library's
# gtests prove at one world size (Checkpoint.EveryShardableOptimizerResumesExactly:
# every optimizer, both formats, bit for bit; ckpt-keep: --resume through
# --ckpt-dir bit for bit): a full-format checkpoint resumes through the
# trainer bit for bit; a sharded one resumes on other world sizes and
# strategies (W = 1 no_shard, W = 4 hybrid_shard, same global batch), and
# across W = 2 -> 3 -> 4 with padded units in both formats, within 1e-5.
# Bad checkpoints are refused, naming the file; a rank killed mid-save
# leaves the previous checkpoint loadable.
make_text_data
common=(--preset tiny --data "$work/data.txt")
# The uninterrupted run, saving (sharded) at step 3 on the way.
train_run straight 2 "${common[@]}" --steps 10 --ckpt-dir "$work/ck-sharded" --ckpt-every 3 --ckpt-keep 10
require_step_numbers "$work/straight.jsonl" 1 10
json_ok "$work/straight.json" '.first_step == 0 and .resumed_from == null' "a run without --resume reports a resume"
cp -r "$work/ck-sharded/step-3" "$work/sharded-step-3"
# Full format: stopped at step 3, resumed to 10 with the same log (steps
# 4..10 appended to 1..3): the uninterrupted run bit for bit.
ck="$work/ck-full"
train_run resumed-full 2 "${common[@]}" --steps 3 --ckpt-dir "$ck" --ckpt-format full
json_ok "$work/resumed-full.json" '.first_step == 0 and .resumed_from == null' "the first run reports a resume"
[ -f "$ck/step-3/model.safetensors" ] && [ -f "$ck/step-3/optimizer.safetensors" ] || fail "full checkpoint files missing"
cp -r "$ck/step-3" "$work/full-step-3"
train_run resumed-full 2 "${common[@]}" --steps 10 --ckpt-dir "$ck" --ckpt-format full --resume
json_is "$work/resumed-full.json" .resumed_from "$ck/step-3"
json_is "$work/resumed-full.json" .first_step 3
json_is "$work/resumed-full.json" .steps 10
require_step_numbers "$work/resumed-full.jsonl" 1 10
same_losses "$work/resumed-full.jsonl" "$work/straight.jsonl" 10
echo "ok: bitwise resume (full)"

# Resharded: from step 3 on another world size and strategy, steps 4..10.
log_steps "$work/straight.jsonl" 4 10 > "$work/straight-4-10.jsonl"
for cfg in "4 hybrid_shard 2" "1 no_shard 8"; do
  read -r ranks strategy batch <<<"$cfg"
  rm -rf "$work/ck3" && mkdir -p "$work/ck3" && cp -r "$work/sharded-step-3" "$work/ck3/step-3"
  name="reshard-$ranks-$strategy"
  launcher=(); [ "$ranks" -eq 1 ] || launcher=(--ranks-per-node 2 --)
  train_run "$name" "$ranks" "${launcher[@]}" "${common[@]}" --steps 10 --batch "$batch" --strategy "$strategy" \
    --ckpt-dir "$work/ck3" --resume
  json_is "$work/$name.json" '[.strategy, .world_size, .first_step] | @csv' "\"$strategy\",$ranks,3"
  json_is "$work/$name.json" .resumed_from "$work/ck3/step-3"
  [ "$strategy" != hybrid_shard ] || json_is "$work/$name.json" '[.shard_group_size, .replicate_group_size] | @csv' "2,2"
  require_step_numbers "$work/$name.jsonl" 4 10
  compare_losses "$work/$name.jsonl" "$work/straight-4-10.jsonl" 1e-5 7
done

# Resharded over padded units, W = 2 -> 3 -> 4 (global batch 12): saved at
# step 3 by 2 ranks, resumed and saved at step 6 by 3, resumed to step 9 by
# 4, in both formats, follows the uninterrupted run within 1e-5. Width 35
# (5 heads), context 31: no unit (root 10115 elements, blocks 15155)
# divides by 2, 3 or 4, so every save and load crosses padding.
uneven=(--preset tiny --width 35 --heads 5 --context 31 --data "$work/data.txt")
train_run uneven-straight 2 "${uneven[@]}" --steps 9 --batch 6
for format in sharded full; do
  ck="$work/ck-uneven-$format"
  name="uneven-$format"
  for cfg in "2 6 3 0" "3 4 6 3" "4 3 9 6"; do
    read -r ranks batch steps first <<<"$cfg"
    resume=(); [ "$first" -eq 0 ] || resume=(--resume)
    train_run "$name" "$ranks" "${uneven[@]}" --steps "$steps" --batch "$batch" --ckpt-dir "$ck" --ckpt-format "$format" "${resume[@]}"
    json_is "$work/$name.json" '[.world_size, .first_step] | @csv' "$ranks,$first"
    [ "$first" -eq 0 ] || json_is "$work/$name.json" .resumed_from "$ck/step-$first"
    json_is "$ck/step-$steps/metadata.json" '[.world_size, .step] | @csv' "$ranks,$steps"
  done
  require_step_numbers "$work/$name.jsonl" 1 9
  compare_losses "$work/$name.jsonl" "$work/uneven-straight.jsonl" 1e-5 9
  echo "ok: resharded W = 2 -> 3 -> 4 over padded units ($format)"
done

# Bad checkpoints are refused, naming the file.
bad_ckpt() { rm -rf "$work/ckbad" && mkdir -p "$work/ckbad" && cp -r "$work/$1-step-3" "$work/ckbad/step-3"; }
resume_bad=("$run" -n 2 -- "$train" "${common[@]}" --steps 5 --ckpt-dir "$work/ckbad" --resume)
bad_ckpt sharded
corrupt_byte "$work/ckbad/step-3/shard-1.safetensors"
expect_error "shard-1.safetensors' is corrupt: its bytes have checksum" "${resume_bad[@]}"
rm "$work/ckbad/step-3/shard-1.safetensors"
expect_error "is missing 'shard-1.safetensors'" "${resume_bad[@]}"
bad_ckpt full
corrupt_byte "$work/ckbad/step-3/model.safetensors"
expect_error "model.safetensors' is corrupt" "${resume_bad[@]}"
bad_ckpt full
truncate -s -100 "$work/ckbad/step-3/optimizer.safetensors"
expect_error "optimizer.safetensors': tensor 'transformer.h.1.mlp.c_proj.bias.exp_avg_sq': data_offsets [947968, 948224] lie outside the data section" "${resume_bad[@]}"
bad_ckpt full
sed -i 's/"step": 3/"step": 4/' "$work/ckbad/step-3/metadata.json"
expect_error "metadata.json' is corrupt" "${resume_bad[@]}"
expect_error "(another model configuration)" "$run" -n 2 -- "$train" "${common[@]}" --width 32 --steps 5 --ckpt-dir "$work/ck-full" --resume
expect_error "unknown checkpoint format 'zip'" "$run" -n 2 -- "$train" "${common[@]}" --ckpt-dir "$work/x" --ckpt-format zip

# A rank killed (kill -9) in the middle of a save (its second, step 4: rank
# 1 while writing its shard; rank 0, the only writer, of a full save) leaves
# step 2 complete and loadable, and the resumed run continues exactly,
# steps 3..6. Unfinished saves are ignored and later pruned.
log_steps "$work/straight.jsonl" 3 6 > "$work/straight-3-6.jsonl"
for cfg in "sharded 1" "full 0"; do
  read -r format victim <<<"$cfg"
  ck="$work/kill-$format"
  FSDP_TEST_KILL_IN_SAVE="$victim:2" "$run" -n 2 -- "$train" "${common[@]}" --steps 6 --ckpt-dir "$ck" --ckpt-every 2 \
    --ckpt-format "$format" > "$work/kill.out" 2>&1 && { cat "$work/kill.out"; fail "the job survived a rank killed mid-save"; }
  [ -d "$ck/step-4.tmp" ] && [ ! -e "$ck/step-4" ] && [ -f "$ck/step-2/metadata.json" ] || { ls -R "$ck"; fail "$format: not killed mid-save"; }
  "$build/fsdp-ckpt" verify "$ck/step-2" >/dev/null || fail "$format: step 2 does not verify after the kill"
  name="after-kill-$format"
  train_run "$name" 2 "${common[@]}" --steps 6 --ckpt-dir "$ck" --ckpt-every 2 --ckpt-format "$format" --resume
  json_is "$work/$name.json" .resumed_from "$ck/step-2"
  json_is "$work/$name.json" .first_step 2
  require_step_numbers "$work/$name.jsonl" 3 6
  same_losses "$work/$name.jsonl" "$work/straight-3-6.jsonl" 4
  [ ! -e "$ck/step-4.tmp" ] && [ -f "$ck/step-6/metadata.json" ] || { ls "$ck"; fail "$format: the unfinished save was not replaced"; }
  echo "ok: rank $victim killed mid-save ($format): resumed from step 2, losses exact"
done
