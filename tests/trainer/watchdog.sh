#!/usr/bin/env bash
# A rank that never makes a collective: the others' watchdog ends the job
# within the timeout, naming the call. A rank killed (kill -9) in the
# middle of training: the job ends non-zero, soon.
source "$(dirname "$0")/lib.sh" "$@"

start=$(date +%s%N)
expect_error "collective watchdog: all_reduce(Float, 4 elements per rank, sum) (call #0 of a group of 2 ranks" \
  "$run" -n 2 -- "$build/tests/watchdog_probe" 2
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "stalled job ended after ${elapsed_ms} ms (timeout 2 s)"
[ "$elapsed_ms" -lt 20000 ] || fail "the stalled job took ${elapsed_ms} ms to end"

# fsdp-run execs mpirun: $job is mpirun, and the ranks are the fsdp-train
# processes below it (never the launcher itself).
"$run" -n 2 -- "$train" --preset tiny --steps 100000 --print-every 1 --collective-timeout 10 --log "$work/kill.jsonl" > "$work/kill.out" 2>&1 &
job=$!
# On failure: the ranks first (killing mpirun alone would orphan them), then mpirun.
stop_job() {
  local pid
  for pid in $(rank_pids "$job" fsdp-train); do kill -9 "$pid" 2>/dev/null; done
  kill -9 "$job" 2>/dev/null; wait "$job" 2>/dev/null
}
for _ in $(seq 1 150); do [ -s "$work/kill.jsonl" ] && break; sleep 0.2; done
[ -s "$work/kill.jsonl" ] || { stop_job; cat "$work/kill.out" >&2; fail "training did not start"; }
mapfile -t ranks < <(rank_pids "$job" fsdp-train)
[ "${#ranks[@]}" -eq 2 ] || { ps -ef --forest >&2; stop_job; fail "found ${#ranks[@]} fsdp-train rank(s) below the job ($job), expected 2: ${ranks[*]}"; }
victim=${ranks[1]}
[ "$victim" != "$job" ] || { stop_job; fail "the victim is the launcher"; }
cmdline=$(tr '\0' ' ' < "/proc/$victim/cmdline")
[ "$(basename -- "$(tr '\0' '\n' < "/proc/$victim/cmdline" | head -1)")" = fsdp-train ] &&
  grep -qF -- "--steps 100000" <<<"$cmdline" || { stop_job; fail "the victim $victim is not a rank: $cmdline"; }
echo "killing rank process $victim ($cmdline), child of $(ps -o comm= -p "$(ps -o ppid= -p "$victim" | tr -d ' ')")"
start=$(date +%s%N)
kill -9 "$victim" || { stop_job; fail "could not kill $victim"; }
status=0
wait $job || status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "job ended with status $status ${elapsed_ms} ms after a rank was killed"
[ "$status" -ne 0 ] || fail "the job exited 0 after a rank was killed"
[ "$elapsed_ms" -lt 30000 ] || fail "the job took ${elapsed_ms} ms to end after a rank was killed"
# Training was under way, and stopped: no rank is left behind.
records=$(jq -s length "$work/kill.jsonl")
[ "$records" -ge 1 ] && [ "$records" -lt 100000 ] || fail "the log holds $records records"
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st:0:1}" != Z ]; }  # zombies are over
for pid in "${ranks[@]}"; do
  for _ in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
  ! running "$pid" || fail "rank process $pid outlived the job"
done
pass
