# --ckpt-async through fsdp-train (the library's gtests prove the files equal
# a synchronous save's byte for byte while training changes the state, that
# a second save waits, and that a failed write surfaces:
# Checkpoint.Async*). Here, in both formats: the run's losses and every
# checkpoint file equal the synchronous run's; a save that finds the one
# before still writing waits, and the printout and summary say so and give
# the time blocked and the time in the background; a resume from an
# asynchronous checkpoint continues bit for bit; a rank killed (kill -9)
# during a background write leaves the previous checkpoint complete and
# loadable.
make_text_data
common=(--preset tiny --data "$work/data.txt" --steps 6 --ckpt-every 2 --ckpt-keep 10)
train_run straight 2 --preset tiny --data "$work/data.txt" --steps 6
log_steps "$work/straight.jsonl" 3 6 > "$work/straight-3-6.jsonl"
log_steps "$work/straight.jsonl" 5 6 > "$work/straight-5-6.jsonl"
for format in sharded full; do
  train_run "sync-$format" 2 "${common[@]}" --ckpt-dir "$work/sync-$format" --ckpt-format "$format"
  # Each background write first sleeps 1.5 s: the steps (tiny: milliseconds)
  # run beside it, and the save two steps later finds it still writing.
  FSDP_TEST_BACKGROUND_WRITE_DELAY_MS=1500 train_run "async-$format" 2 "${common[@]}" \
    --ckpt-dir "$work/async-$format" --ckpt-format "$format" --ckpt-async
  same_losses "$work/async-$format.jsonl" "$work/sync-$format.jsonl" 6
  same_losses "$work/async-$format.jsonl" "$work/straight.jsonl" 6
  for step in 2 4 6; do
    for file in "$work/sync-$format/step-$step"/*; do
      cmp -s "$file" "$work/async-$format/step-$step/$(basename "$file")" ||
        fail "$format: step-$step/$(basename "$file") of the --ckpt-async run differs from the synchronous run's"
    done
  done
  json_is "$work/async-$format.json" '[.checkpoint.async, .checkpoint.format, .checkpoint.saves, .checkpoint.published] | @csv' \
    "true,\"$format\",3,3"
  json_ok "$work/async-$format.json" '.checkpoint.saves_waited >= 1 and .checkpoint.waited_s > 1' \
    "no save waited for the one before, though every write sleeps 1.5 s"
  json_ok "$work/async-$format.json" '.checkpoint.background_write_s >= 4.5' "the background writes took less than their sleeps"
  json_ok "$work/async-$format.json" '.checkpoint.blocked_s - .checkpoint.waited_s < 1.5' \
    "training was blocked more than the waits and the staging copies"
  json_is "$work/sync-$format.json" '[.checkpoint.async, .checkpoint.saves_waited, .checkpoint.background_write_s] | @csv' \
    "false,0,0"
  grep -q "waited .* s for the previous save's background write" "$work/async-$format.out" ||
    fail "$format: the printout does not say that a save waited"
  grep -q "step-6 written in the background and published" "$work/async-$format.out" ||
    fail "$format: the last save was not published before the run ended"
  # Resumed from the asynchronous step-4: steps 5 and 6 as the straight run.
  ck="$work/resume-$format" && mkdir -p "$ck" && cp -r "$work/async-$format/step-4" "$ck/"
  train_run "resumed-$format" 2 "${common[@]}" --ckpt-dir "$ck" --ckpt-format "$format" --ckpt-async --resume
  json_is "$work/resumed-$format.json" .resumed_from "$ck/step-4"
  require_step_numbers "$work/resumed-$format.jsonl" 5 6
  same_losses "$work/resumed-$format.jsonl" "$work/straight-5-6.jsonl" 2
  echo "ok: --ckpt-async ($format): files and losses as the synchronous run's, a save waited, resume bit for bit"
done

# Rank 1 killed (kill -9) in its second save's background write (step 4,
# after its first tensor; full format: rank 1 writes nothing, so rank 0, the
# writer, is the victim) while training goes on: step 2 stays complete, step
# 4 is never published, and a resume continues exactly.
for cfg in "sharded 1" "full 0"; do
  read -r format victim <<<"$cfg"
  ck="$work/kill-$format"
  FSDP_TEST_BACKGROUND_WRITE_DELAY_MS=300 FSDP_TEST_KILL_IN_SAVE="$victim:2" "$run" -n 2 -- "$train" "${common[@]}" \
    --ckpt-dir "$ck" --ckpt-format "$format" --ckpt-async > "$work/kill.out" 2>&1 &&
    { cat "$work/kill.out"; fail "the job survived a rank killed in a background write"; }
  [ -d "$ck/step-4.tmp" ] && [ ! -e "$ck/step-4" ] && [ -f "$ck/step-2/metadata.json" ] ||
    { ls -R "$ck"; cat "$work/kill.out"; fail "$format: not killed in the background write of step 4"; }
  "$build/fsdp-ckpt" verify "$ck/step-2" >/dev/null || fail "$format: step 2 does not verify after the kill"
  name="after-kill-$format"
  train_run "$name" 2 "${common[@]}" --ckpt-dir "$ck" --ckpt-format "$format" --ckpt-async --resume
  json_is "$work/$name.json" .resumed_from "$ck/step-2"
  require_step_numbers "$work/$name.jsonl" 3 6
  same_losses "$work/$name.jsonl" "$work/straight-3-6.jsonl" 4
  [ ! -e "$ck/step-4.tmp" ] && [ -f "$ck/step-6/metadata.json" ] || { ls "$ck"; fail "$format: the unfinished save was not replaced"; }
  echo "ok: rank $victim killed in a background write ($format): resumed from step 2, losses exact"
done

# A preemption (SIGTERM raised on rank 0 during its first background write)
# stops at a step boundary with the last save published before the exit:
# status 75, and the step it names is complete and verifies.
ck="$work/preempted"
FSDP_TEST_BACKGROUND_WRITE_DELAY_MS=500 FSDP_TEST_SIGNAL_IN_SAVE=0:1 "$run" -n 2 -- "$train" --preset tiny \
  --data "$work/data.txt" --steps 20 --ckpt-dir "$ck" --ckpt-every 2 --ckpt-async --summary "$work/preempted.json" \
  > "$work/preempted.out" 2>&1 && status=0 || status=$?
[ "$status" -eq 75 ] || { cat "$work/preempted.out"; fail "a preempted --ckpt-async run exited $status, expected 75"; }
after=$(jq -r .preempted_after_step "$work/preempted.json")
[ -f "$ck/step-$after/metadata.json" ] && [ ! -e "$ck/step-$after.tmp" ] || { ls "$ck"; fail "step $after was not published"; }
"$build/fsdp-ckpt" verify "$ck/step-$after" >/dev/null || fail "the preempted run's step $after does not verify"
echo "ok: preempted during a background write: exit 75, step $after published"
