# Preemption and the cluster checks. A SIGTERM to fsdp-run (Slurm's, or
# Kubernetes') or a SIGUSR1 to one rank: every rank stops at the next step
# boundary, a checkpoint of that step is saved, and the job exits 75; the
# resumed run gives the uninterrupted run's losses bit for bit. A signal in
# the middle of a save: the save completes and is the checkpoint. Without
# --ckpt-dir: exit 76. A second signal ends the job at once. A scheduler's
# many tasks that MPI sees as worlds of one are refused; so is a checkpoint
# folder that a rank cannot see.

# The runs a signal stops get far more steps than they will take: the
# test's own shell shares the two cores with two busy ranks and may wait
# seconds for a slice, and a signal that comes after the last step stops
# nothing (300 tiny steps take 2 s on a fast CPU; a USR1 once came after
# the last one). The straight run they are compared with runs afterwards,
# to a little past the latest stop; the schedule is constant and the data
# order does not depend on --steps, which resumes_exactly checks too.
long_steps=5000
long=(--preset tiny --steps "$long_steps")

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
# stopped_at NAME: the step after which the run NAME was preempted (checked to have its checkpoint).
stopped_at() {
  local at; at=$(jq -r .preempted_after_step "$work/$1.json")
  [ "$at" != null ] && [ "$at" -lt "$long_steps" ] || fail "$1: preempted_after_step is $at"
  [ -f "$work/ck-$1/step-$at/metadata.json" ] || fail "$1: no checkpoint of step $at"
  require_step_numbers "$work/$1.jsonl" 1 "$at"
  echo "$at"
}
# resumes_exactly NAME AT: the run's checkpoint at its last step (AT, from
# stopped_at) resumes to the straight run's losses ($end steps), and its own
# steps were the straight run's.
resumes_exactly() {
  local name="$1" at="$2"
  log_steps "$work/straight.jsonl" 1 "$at" > "$work/straight-head.jsonl"
  same_losses "$work/$name.jsonl" "$work/straight-head.jsonl" "$at"
  train_run "$name-resumed" 2 --preset tiny --steps "$end" --ckpt-dir "$work/ck-$name" --resume
  json_is "$work/$name-resumed.json" .first_step "$at"
  log_steps "$work/$name-resumed.jsonl" $(( at + 1 )) "$end" > "$work/$name-tail.jsonl"
  log_steps "$work/straight.jsonl" $(( at + 1 )) "$end" > "$work/straight-tail.jsonl"
  same_losses "$work/$name-tail.jsonl" "$work/straight-tail.jsonl" $(( end - at ))
  echo "ok: $name stopped after step $at with a checkpoint that resumes exactly"
}

# SIGTERM to the launcher.
start term "${long[@]}" --ckpt-dir "$work/ck-term" --ckpt-every 1000
wait_for_step term 5
kill -TERM "$pid"
finish term 75
grep -q "preempted .* checkpoint $work/ck-term/step-" "$work/term.out" || { cat "$work/term.out"; fail "no preemption line"; }

# SIGUSR1 to one rank only: the others learn it at the step boundary.
start usr1 "${long[@]}" --ckpt-dir "$work/ck-usr1" --ckpt-every 1000
wait_for_step usr1 5
victim=$(rank_pids "$pid" fsdp-train | tail -1)
[ -n "$victim" ] || fail "no rank found under fsdp-run"
kill -USR1 "$victim"
finish usr1 75

# A signal in the middle of rank 1's first save (step 3): the save completes and is the checkpoint.
FSDP_TEST_SIGNAL_IN_SAVE=1:1 start in-save "${long[@]}" --ckpt-dir "$work/ck-in-save" --ckpt-every 3
finish in-save 75
json_is "$work/in-save.json" .preempted_after_step 3

# The straight run, to 20 steps past the latest stop; each stopped run resumes to it exactly.
at_term=$(stopped_at term) || exit 1
at_usr1=$(stopped_at usr1) || exit 1
at_in_save=$(stopped_at in-save) || exit 1
end=$(( (at_term > at_usr1 ? at_term : at_usr1) + 20 ))
train_run straight 2 --preset tiny --steps "$end"
resumes_exactly term "$at_term"
resumes_exactly usr1 "$at_usr1"
resumes_exactly in-save "$at_in_save"

# Without --ckpt-dir: exit 76, nothing saved.
start unsaved "${long[@]}"
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
