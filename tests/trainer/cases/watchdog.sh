# A rank that never makes a collective: the others' watchdog ends the job
# within the timeout, naming the call (a probe program, the same program
# letting the error unwind through the stuck group, then fsdp-train's
# own --collective-timeout with a rank stopped by SIGSTOP mid-training). A
# rank killed (kill -9) in the middle of training: the job ends non-zero,
# soon. No rank process outlives its job.

start=$(date +%s%N)
expect_error "collective watchdog: all_reduce(Float, 4 elements per rank, sum) (call #0 of a group of 2 ranks" \
  timeout 60 "$run" -n 2 -- "$build/tests/watchdog_probe" 2
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "stalled job ended after ${elapsed_ms} ms (timeout 2 s)"
[ "$elapsed_ms" -lt 20000 ] || fail "the stalled job took ${elapsed_ms} ms to end"

# An error that unwinds through the owner of a group whose collective is
# stuck (nobody called abort): destroying the group ends the job, after
# the timeout, instead of waiting for the collective forever.
start=$(date +%s%N)
expect_error "collective watchdog: a process group was destroyed while its all_reduce(Float, 4 elements per rank, sum) (call #0)" \
  timeout 60 "$run" -n 2 -- "$build/tests/watchdog_probe" 2 unwind
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "unwound job ended after ${elapsed_ms} ms (timeout 2 s, twice)"
[ "$elapsed_ms" -lt 25000 ] || fail "the unwound job took ${elapsed_ms} ms to end"

# start_training NAME TIMEOUT_S: a long fsdp-train job of 2 ranks in the
# background, $job its launcher (fsdp-run execs mpirun), $work/NAME.jsonl
# its log; returns once training is under way, with ranks (an array) the
# fsdp-train processes below the launcher (never the launcher itself).
job=""
ranks=()
start_training() {
  "$run" -n 2 -- "$train" --preset tiny --steps 100000 --print-every 1 --collective-timeout "$2" \
    --log "$work/$1.jsonl" > "$work/$1.out" 2>&1 &
  job=$!
  for _ in $(seq 1 150); do [ -s "$work/$1.jsonl" ] && break; sleep 0.2; done
  [ -s "$work/$1.jsonl" ] || { cat "$work/$1.out" >&2; fail "$1: training did not start"; }
  mapfile -t ranks < <(rank_pids "$job" fsdp-train)
  [ "${#ranks[@]}" -eq 2 ] || { ps -ef --forest >&2; fail "$1: found ${#ranks[@]} fsdp-train rank(s) below the job ($job), expected 2: ${ranks[*]}"; }
  local pid
  for pid in "${ranks[@]}"; do
    [ "$pid" != "$job" ] && [ "$(basename -- "$(tr '\0' '\n' < "/proc/$pid/cmdline" | head -1)")" = fsdp-train ] &&
      grep -qF -- "--steps 100000" <<<"$(tr '\0' ' ' < "/proc/$pid/cmdline")" || fail "$1: $pid is not a rank"
  done
}
# On any exit: the ranks first (SIGKILL: a stopped process takes no other
# signal; killing mpirun alone would orphan them), then the launcher.
stop_job() {
  local pid
  [ -n "$job" ] || return 0
  for pid in "${ranks[@]}" $(rank_pids "$job" fsdp-train); do kill -9 "$pid" 2>/dev/null; done
  kill -9 "$job" 2>/dev/null; wait "$job" 2>/dev/null
  job=""
}
trap 'stop_job; rm -rf "$work"' EXIT
# wait_job BOUND_MS: waits for the job to end, at most BOUND_MS after
# $start; status and elapsed_ms say how it ended.
wait_job() {
  while kill -0 "$job" 2>/dev/null && [ $(( ($(date +%s%N) - start) / 1000000 )) -lt "$1" ]; do sleep 0.1; done
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  kill -0 "$job" 2>/dev/null && fail "the job was still running ${elapsed_ms} ms after a rank was stopped or killed"
  status=0
  wait "$job" || status=$?
  job=""
}
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st:0:1}" != Z ]; }  # zombies are over
# no_rank_left NAME: training was under way, and stopped; no rank remains.
no_rank_left() {
  local records pid
  records=$(jq -s length "$work/$1.jsonl")
  [ "$records" -ge 1 ] && [ "$records" -lt 100000 ] || fail "$1: the log holds $records records"
  for pid in "${ranks[@]}"; do
    for _ in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
    ! running "$pid" || fail "$1: rank process $pid outlived the job"
  done
}

# fsdp-train --collective-timeout 5 with rank 1 stopped (SIGSTOP): rank 0
# waits in its next collective, and its watchdog ends the job 5 s into that
# wait, naming the collective. Bounds: at least 4 s after the stop (rank 0
# may already be waiting when rank 1 stops, for at most about a step of a
# few milliseconds) and well before the default timeout (600 s). 5 s, not
# less: a loaded CI machine must not stall a healthy collective that long.
start_training stop 5
victim=${ranks[1]}
echo "stopping rank process $victim ($(tr '\0' ' ' < "/proc/$victim/cmdline"))"
start=$(date +%s%N)
kill -STOP "$victim" || fail "could not stop $victim"
wait_job 30000
echo "job ended with status $status ${elapsed_ms} ms after a rank was stopped"
[ "$status" -ne 0 ] || fail "the job exited 0 after a rank was stopped"
[ "$elapsed_ms" -ge 4000 ] || { cat "$work/stop.out" >&2; fail "the job ended ${elapsed_ms} ms after the stop, before the 5 s timeout"; }
message=$(grep -m1 "collective watchdog: " "$work/stop.out") || { cat "$work/stop.out" >&2; fail "no watchdog message"; }
echo "$message"
grep -qE "collective watchdog: (all_gather|reduce_scatter|all_reduce|broadcast)\(.*\) \(call #[0-9]+ of a group of 2 ranks.* did not complete within 5 s" \
  <<<"$message" || fail "the watchdog message does not name the collective and the 5 s timeout: $message"
no_rank_left stop

# A rank killed (kill -9) in the middle of training.
start_training kill 10
victim=${ranks[1]}
echo "killing rank process $victim ($(tr '\0' ' ' < "/proc/$victim/cmdline")), child of $(ps -o comm= -p "$(ps -o ppid= -p "$victim" | tr -d ' ')")"
start=$(date +%s%N)
kill -9 "$victim" || fail "could not kill $victim"
wait_job 30000
echo "job ended with status $status ${elapsed_ms} ms after a rank was killed"
[ "$status" -ne 0 ] || fail "the job exited 0 after a rank was killed"
no_rank_left kill
