# Preemption and the cluster checks. A SIGTERM to fsdp-run (Slurm's, or
# Kubernetes') or a SIGUSR1 to one rank: every rank stops at the next step
# boundary, a checkpoint of that step is saved, and the job exits 75; the
# resumed run gives the uninterrupted run's losses bit for bit. A signal in
# the middle of a save: the save completes and is the checkpoint. Without
# --ckpt-dir: exit 76. A second signal ends the job at once. A scheduler's
# many tasks that MPI sees as worlds of one are refused; so is a checkpoint
# folder that a rank cannot see.

common=(--preset tiny --steps 300)
train_run straight 2 "${common[@]}"

# start NAME ARGS...: the trainer in the background ($pid: fsdp-run's), its log $work/NAME.jsonl.
start() {
  local name="$1"; shift
  "$run" -n 2 -- "$train" --log "$work/$name.jsonl" --summary "$work/$name.json" "$@" > "$work/$name.out" 2>&1 &
  pid=$!
}
# wait_for_step NAME N: until the log has step N (at most 120 s).
wait_for_step() {
  local i
  for i in $(seq 1200); do
    [ "$(grep -c '"step"' "$work/$1.jsonl" 2>/dev/null)" -ge "$2" ] 2>/dev/null && return 0  # a record a step
    kill -0 "$pid" 2>/dev/null || { cat "$work/$1.out"; fail "$1 ended before step $2"; }
    sleep 0.1
  done
  fail "$1 did not reach step $2"
}
# finish NAME WANT: fsdp-run's exit status must be WANT.
finish() {
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq "$2" ] || { cat "$work/$1.out"; fail "$1: exit status $rc, expected $2"; }
}
# resumes_exactly NAME: the run's checkpoint at its last step resumes to the straight run's losses.
resumes_exactly() {
  local name="$1" at
  at=$(jq -r .preempted_after_step "$work/$name.json")
  [ "$at" != null ] && [ "$at" -lt 300 ] || fail "$name: preempted_after_step is $at"
  [ -f "$work/ck-$name/step-$at/metadata.json" ] || fail "$name: no checkpoint of step $at"
  require_step_numbers "$work/$name.jsonl" 1 "$at"
  train_run "$name-resumed" 2 "${common[@]}" --ckpt-dir "$work/ck-$name" --resume
  json_is "$work/$name-resumed.json" .first_step "$at"
  log_steps "$work/$name-resumed.jsonl" $(( at + 1 )) 300 > "$work/$name-tail.jsonl"
  log_steps "$work/straight.jsonl" $(( at + 1 )) 300 > "$work/straight-tail.jsonl"
  same_losses "$work/$name-tail.jsonl" "$work/straight-tail.jsonl" $(( 300 - at ))
  echo "ok: $name stopped after step $at with a checkpoint that resumes exactly"
}

# SIGTERM to the launcher.
start term "${common[@]}" --ckpt-dir "$work/ck-term" --ckpt-every 1000
wait_for_step term 5
kill -TERM "$pid"
finish term 75
grep -q "preempted .* checkpoint $work/ck-term/step-" "$work/term.out" || { cat "$work/term.out"; fail "no preemption line"; }
resumes_exactly term

# SIGUSR1 to one rank only: the others learn it at the step boundary.
start usr1 "${common[@]}" --ckpt-dir "$work/ck-usr1" --ckpt-every 1000
wait_for_step usr1 5
victim=$(rank_pids "$pid" fsdp-train | tail -1)
[ -n "$victim" ] || fail "no rank found under fsdp-run"
kill -USR1 "$victim"
finish usr1 75
resumes_exactly usr1

# A signal in the middle of rank 1's first save (step 3): the save completes and is the checkpoint.
FSDP_TEST_SIGNAL_IN_SAVE=1:1 start in-save "${common[@]}" --ckpt-dir "$work/ck-in-save" --ckpt-every 3
finish in-save 75
json_is "$work/in-save.json" .preempted_after_step 3
resumes_exactly in-save

# Without --ckpt-dir: exit 76, nothing saved.
start unsaved "${common[@]}"
wait_for_step unsaved 5
kill -TERM "$pid"
finish unsaved 76

# A second signal ends the job at once (small: a step takes long enough for both to arrive within it).
start twice --preset small --steps 50 --ckpt-dir "$work/ck-twice"
wait_for_step twice 1
kill -TERM "$pid"; sleep 0.05; kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 75 ] || { cat "$work/twice.out"; fail "two signals: exit status $rc"; }
echo "ok: a second signal ends the job (exit $rc)"

# A scheduler's tasks that are each a world of one (srun without PMIx).
expect_error "MPI sees a world of 1" env SLURM_NTASKS=4 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$train" --preset tiny --steps 1

# A checkpoint folder rank 1 cannot see: ckpt-folder-unshared (a private mount, which needs unshare -m).
