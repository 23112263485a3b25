#!/usr/bin/env bash
# The sharded MLP example at W = 2: it trains (the program itself exits
# non-zero unless its loss fell), and each rank reports its shard ("rank R
# of W holds N parameter elements in U unit shards").
source "$(dirname "$0")/lib.sh" "$@"

out=$("$run" -n 2 -- "$build/example-mlp" 2>&1) || { echo "$out"; fail "example failed"; }
echo "$out"
shards=$(sed -n 's/^rank \([0-9]*\) of \([0-9]*\) holds \([0-9]*\) parameter elements in \([0-9]*\) unit shards$/\1 \2 \3 \4/p' <<<"$out" | sort -n)
[ "$(cut -d' ' -f1,2 <<<"$shards" | paste -sd,)" = "0 2,1 2" ] || fail "expected a shard report from ranks 0 and 1 of 2, got: $shards"
while read -r r w n u; do
  [ "$n" -gt 0 ] && [ "$u" -gt 0 ] || fail "rank $r holds $n elements in $u unit shards"
done <<<"$shards"
[ "$(cut -d' ' -f4 <<<"$shards" | sort -u | wc -l)" -eq 1 ] || fail "the ranks hold different numbers of units: $shards"
# The loss (printed at steps 1, 20, ..., 100) falls.
first=$(sed -n 's/^step 1 loss \(.*\)$/\1/p' <<<"$out"); last=$(sed -n 's/^step 100 loss \(.*\)$/\1/p' <<<"$out")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b > 0 && b < a) }' || fail "the loss did not fall: step 1 $first, step 100 $last"
pass
