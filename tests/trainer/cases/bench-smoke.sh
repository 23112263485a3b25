# The benchmark suite end to end on tiny: every fsdp-cpp variant runs once,
# and for each the planner's model state equals the measured (results.jsonl,
# the trainer's summaries); the table has a row for each. PyTorch's peers
# against the same LibTorch are bench-peers'.

ours="local no_shard no_shard_ac no_shard_bf16 zero1 shard_grad_op full_shard full_shard_noprefetch full_shard_ac
      full_shard_bf16 full_shard_lowmem no_shard_w4 full_shard_w4"
# shellcheck disable=SC2086
FSDP_BUILD="$build" "$here/../../bench/suite.sh" --preset tiny --steps 2 --out "$work/suite" \
  --variants "$(echo $ours)" > "$work/suite.out" 2>&1 || { cat "$work/suite.out"; fail "the benchmark suite failed"; }
cat "$work/suite.out"
results="$work/suite/results.jsonl"
require_steps "$results" "$(wc -w <<<"$ours")"
for v in $ours; do
  log_is "$results" "map(select(.variant == \"$v\")) | length" 1
  log_ok "$results" "map(select(.variant == \"$v\"))[0] | .steps == 2 and .model_state_bytes_predicted > 0
                     and (.model_state_bytes | length) == .world_size and (.model_state_bytes | max) == .model_state_bytes_predicted" \
    "$v: measured model state $(jq -sc "map(select(.variant == \"$v\"))[0].model_state_bytes" "$results"), planner $(jq -s "map(select(.variant == \"$v\"))[0].model_state_bytes_predicted" "$results")"
  grep -q "^$v " "$work/suite/table.txt" || fail "no row for $v in the table"
done
