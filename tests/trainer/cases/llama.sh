# examples/llama.cpp, the library's Llama trained by a user-written loop through fsdp::TrainStep:
# W ranks with batch B train the same model as 1 rank with batch W*B (also
# with gradient accumulation), its parameters really are sharded, and the
# loss goes down (the program itself exits non-zero unless its last loss is
# below its first, so every run below checks that too).
llama="$build/example-llama"
steps=10

# llama_run NAME RANKS ARGS...: $work/NAME.jsonl (log) and $work/NAME.out.
llama_run() {
  local name="$1" ranks="$2"; shift 2
  "$run" -n "$ranks" -- "$llama" --steps "$steps" --log "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1 ||
    { cat "$work/$name.out" >&2; fail "run '$name' ($ranks ranks: $*) failed"; }
}

llama_run w1 1 --batch 4
llama_run w2 2 --batch 2
llama_run w4 4 --batch 1
llama_run w2_accum 2 --batch 1 --micro-steps 2

# The comparisons below must see real numbers: every record a finite loss.
for log in w1 w2 w4 w2_accum; do
  jq -se 'length > 0 and all(.[]; (.loss | type) == "number" and (.step | type) == "number")' "$work/$log.jsonl" >/dev/null ||
    fail "$log.jsonl holds a record without a numeric step and loss"
done
compare_losses "$work/w2.jsonl" "$work/w1.jsonl" 1e-5 "$steps"
compare_losses "$work/w4.jsonl" "$work/w1.jsonl" 1e-5 "$steps"
compare_losses "$work/w2_accum.jsonl" "$work/w1.jsonl" 1e-5 "$steps"

# It learns: the last loss is well below the first (ln 256 = 5.5 at the start).
first=$(losses "$work/w1.jsonl" | head -1); last=$(losses "$work/w1.jsonl" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 5 && b < a - 1.0) }' || fail "loss did not go down: $first -> $last"

# The tolerance is tight enough to notice other data: a run that trains on
# other sequences (here: half the global batch) fails the comparison.
llama_run w1_half 1 --batch 2
( compare_losses "$work/w1_half.jsonl" "$work/w1.jsonl" 1e-5 "$steps" ) >/dev/null 2>&1 &&
  fail "a run with half the global batch matched the full one: the comparison sees nothing"

# Each rank holds about 1/W of the parameters (the shards), not all of them.
read -r total held < <(sed -n 's/^llama: \([0-9]*\) parameters .* rank 0 holds \([0-9]*\) of them.*/\1 \2/p' "$work/w4.out")
[ -n "${total:-}" ] || { cat "$work/w4.out" >&2; fail "no parameter banner in the W=4 output"; }
awk -v t="$total" -v h="$held" 'BEGIN { exit !(h >= t / 4 && h < t / 4 + 64) }' ||
  fail "rank 0 of 4 holds $held of $total parameters, not a quarter"
echo "rank 0 of 4 holds $held of $total parameters; losses $first -> $last"

expect_error "unknown option --bogus" "$run" -n 2 -- "$llama" --bogus 1
