#!/usr/bin/env bash
# --trace: one Chrome trace per rank with the units' forward and backward,
# the collectives on the communication threads, the waits and the
# optimizer; the summary splits the step.
source "$(dirname "$0")/lib.sh" "$@"

train_run t 2 --preset tiny --steps 3 --forward-prefetch --trace "$work/t.json"
require_step_numbers "$work/t.jsonl" 1 3
# The step split (rank 0, medians): compute, exposed communication and
# optimizer, parts of the step.
json_ok "$work/t.json" '(.step_s | type == "number" and . > 0) and (.exposed_comm_s | type == "number" and . >= 0)
                       and (.optimizer_s | type == "number" and . > 0) and .exposed_comm_s + .optimizer_s < .step_s' \
  "no step split in the summary: $(jq -c '{step_s, exposed_comm_s, optimizer_s}' "$work/t.json")"
for r in 0 1; do
  f="$work/t.rank$r.json"
  [ -s "$f" ] || fail "no trace for rank $r"
  json_ok "$f" '.traceEvents | length > 0' "trace of rank $r is not a Chrome trace"
  # Threads: compute (tid 0) and at least one communication thread.
  for thread in compute "comm 1"; do
    json_ok "$f" "any(.traceEvents[]; .ph == \"M\" and .name == \"thread_name\" and .args.name == \"$thread\")" \
      "trace of rank $r lacks the thread '$thread'"
  done
  json_ok "$f" "all(.traceEvents[]; .pid == $r)" "trace of rank $r holds events of another process"
  for name in "forward transformer.h.1" "backward <root>" all_gather reduce_scatter "optimizer step" "step 1" "step 2" "step 3"; do
    json_ok "$f" "any(.traceEvents[]; .ph == \"X\" and .name == \"$name\" and (.dur | type == \"number\"))" \
      "trace of rank $r lacks a complete ('X') event '$name'"
  done
  # The collectives run on the communication threads, the units on compute.
  json_ok "$f" 'all(.traceEvents[] | select(.ph == "X" and (.name == "all_gather" or .name == "reduce_scatter")); .tid > 0)' \
    "trace of rank $r: a collective on the compute thread"
  json_ok "$f" 'all(.traceEvents[] | select(.ph == "X" and (.name | startswith("forward ") or startswith("backward "))); .tid == 0)' \
    "trace of rank $r: a unit's forward or backward off the compute thread"
done
expect_error "--trace: the directory '$work/nowhere' does not exist" "$run" -n 2 -- "$train" --preset tiny --trace "$work/nowhere/t.json"
pass
