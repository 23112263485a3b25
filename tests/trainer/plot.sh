#!/usr/bin/env bash
# --plot: the loss and memory PNGs from the log (kept in the plot folder
# when no --log is given); fsdp-plot refuses what is not a log.
source "$(dirname "$0")/lib.sh" "$@"

"$run" -n 2 -- "$train" --preset tiny --steps 5 --plot "$work/plots" --summary "$work/plot.json" > "$work/plot.out" 2>&1 ||
  { cat "$work/plot.out" >&2; fail "run with --plot failed"; }
for f in loss memory; do
  [ "$(head -c 8 "$work/plots/$f.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$f.png is not a PNG"
done
require_step_numbers "$work/plots/log.jsonl" 1 5
json_is "$work/plot.json" .final_loss "$(losses "$work/plots/log.jsonl" | tail -1)"
printf 'not json\n' > "$work/bad.jsonl"
expect_error "is not an fsdp-train log" "$build/fsdp-plot" "$work/bad.jsonl" "$work/p2"
expect_error "the log '$work/none.jsonl' is missing or empty" "$build/fsdp-plot" "$work/none.jsonl" "$work/p2"
pass
