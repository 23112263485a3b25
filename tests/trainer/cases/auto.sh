# fsdp-train --strategy auto and fsdp-plan --budget apply one rule
# (fsdp::choose_strategy): the first strategy, from least to most
# communication, whose per-rank model state plus gathered parameters fits.
# For the same model, world and budget both pick the same strategy and give
# the same reason. tiny at W = 4 (units of 18,560 and 2 x 49,984 elements)
# needs: no_shard 1,896,448 B; zero1 1,185,280 B; shard_grad_op 474,112 +
# 474,112 gathered = 948,224 B; full_shard 474,112 + 274,176 (the root and a
# block, gathered) = 748,288 B.
plan="$build/fsdp-plan"

"$plan" --preset tiny --world 4 --json > "$work/tiny.json" || fail "fsdp-plan failed"
need() { jq --arg s "$1" '.strategies[] | select(.strategy == $s) | .needed_bytes' "$work/tiny.json"; }
jq -e '[.strategies[] | [.strategy, .needed_bytes]]
       == [["no_shard", 1896448], ["zero1", 1185280], ["shard_grad_op", 948224], ["full_shard", 748288]]' \
  "$work/tiny.json" >/dev/null || fail "tiny at W = 4 needs $(jq -c '[.strategies[] | [.strategy, .needed_bytes]]' "$work/tiny.json")"

# expect_same_pick NAME EXPECTED BUDGET RANKS [LAUNCHER FLAGS] -- [PLAN ARGS]:
# the trainer (tiny) and the planner pick EXPECTED for BUDGET, with the same
# reason, printed by both; the run's model state is the planned one.
expect_same_pick() {
  local name="$1" expected="$2" budget="$3" ranks="$4" launcher=() plan_args=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  plan_args=("$@")
  "$plan" --preset tiny --world "$ranks" "${plan_args[@]}" --budget "$budget" --json > "$work/$name.plan.json" ||
    fail "$name: fsdp-plan --budget $budget failed"
  train_run "$name" "$ranks" "${launcher[@]}" -- --preset tiny --steps 1 --strategy auto --memory-budget "$budget"
  local planned trained
  planned=$(jq -r .recommendation.strategy "$work/$name.plan.json")
  trained=$(summary "$work/$name.json" .strategy)
  [ "$planned" = "$expected" ] && [ "$trained" = "$expected" ] ||
    fail "$name: a budget of $budget: fsdp-plan picked $planned, fsdp-train $trained, expected $expected"
  local reason
  reason=$(jq -r .recommendation.reason "$work/$name.plan.json")
  [ "$(summary "$work/$name.json" .strategy_reason)" = "$reason" ] ||
    fail "$name: reasons differ: trainer '$(summary "$work/$name.json" .strategy_reason)', planner '$reason'"
  grep -qF -- "$reason" "$work/$name.out" || fail "$name: the trainer did not print the reason"
  "$plan" --preset tiny --world "$ranks" "${plan_args[@]}" --budget "$budget" | grep -F -- "$reason" > /dev/null ||
    fail "$name: the planner did not print the reason"
  jq -e --slurpfile p "$work/$name.plan.json" --arg s "$expected" \
    '($p[0].strategies[] | select(.strategy == $s) | .model_state_bytes) as $m | .model_state_bytes | unique == [$m]' \
    "$work/$name.json" >/dev/null ||
    fail "$name: measured model state $(jq -c .model_state_bytes "$work/$name.json") is not the planned one of $expected"
  echo "ok: $name: a budget of $budget B: both pick $expected"
}

# Budgets at and just below each need.
expect_same_pick roomy no_shard 2000000 4 --
expect_same_pick zero1-exact zero1 "$(need zero1)" 4 --
expect_same_pick zero1-short shard_grad_op $(( $(need zero1) - 1 )) 4 --
expect_same_pick tight full_shard $(( $(need shard_grad_op) - 1 )) 4 --
# Two simulated nodes: hybrid_shard_zero2 comes between zero1 and
# shard_grad_op. (At 2 ranks per node it never fits where zero1 does not:
# its 16/2 B of state per parameter plus 4 B gathered exceed zero1's
# 8 + 8/W. At 4 it does: 948,224 B against zero1's 1,066,752.)
"$plan" --preset tiny --world 8 --nodes 2 --budget 1 --json > "$work/nodes.json" || fail "fsdp-plan --nodes 2 failed"
jq -e '[.recommendation.candidates[].strategy]
       == ["no_shard", "zero1", "hybrid_shard_zero2", "shard_grad_op", "hybrid_shard", "full_shard"]' "$work/nodes.json" >/dev/null ||
  fail "wrong candidates over 2 nodes: $(jq -c '[.recommendation.candidates[].strategy]' "$work/nodes.json")"
hybrid_need=$(jq '.recommendation.candidates[] | select(.strategy == "hybrid_shard_zero2") | .needed_bytes' "$work/nodes.json")
expect_same_pick hybrid hybrid_shard_zero2 "$hybrid_need" 8 --ranks-per-node 4 -- --nodes 2

# Nothing fits: the trainer's error is the planner's reason, naming the
# budget and every candidate's need.
"$plan" --preset tiny --world 4 --budget 1000 --json > "$work/none.json" || fail "fsdp-plan --budget 1000 failed"
[ "$(jq -r .recommendation.strategy "$work/none.json")" = null ] || fail "the planner found a strategy for 1000 B"
expect_error "$(jq -r .recommendation.reason "$work/none.json")" \
  "$run" -n 4 -- "$train" --preset tiny --strategy auto --memory-budget 1000
expect_error "no strategy fits a per-rank budget of 1000 B" \
  "$run" -n 4 -- "$train" --preset tiny --strategy auto --memory-budget 1000
for s in no_shard zero1 shard_grad_op full_shard; do
  grep -qF "$s needs $(need "$s") B" <<<"$(jq -r .recommendation.reason "$work/none.json")" ||
    fail "the error does not name $s's need"
done
expect_error "--strategy auto needs --memory-budget" "$run" -n 2 -- "$train" --preset tiny --strategy auto
