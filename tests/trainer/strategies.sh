#!/usr/bin/env bash
# Every strategy through the trainer (hybrid: 2 simulated nodes of 2), with
# accumulation and clipping, equals one rank with the global batch.
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
common=(--preset tiny --steps 8 --data "$work/data.txt" --clip-grad-norm 0.5)
train_run ref 1 "${common[@]}" --batch 8
require_steps "$work/ref.jsonl" 8
# strategy -> "shard group size, replicate group size" at W = 4, nodes of 2
# (1: no such group).
declare -A groups=([no_shard]="1,4" [zero1]="4,1" [shard_grad_op]="4,1" [full_shard]="4,1"
                   [hybrid_shard]="2,2" [hybrid_shard_zero2]="2,2")
for s in no_shard zero1 shard_grad_op full_shard hybrid_shard hybrid_shard_zero2; do
  train_run "$s" 4 --ranks-per-node 2 -- "${common[@]}" --batch 1 --grad-accum 2 --strategy "$s"
  json_is "$work/$s.json" '[.strategy, .world_size] | @csv' "\"$s\",4"
  log_ok "$work/$s.jsonl" "all(.strategy == \"$s\" and .world_size == 4)" "$s: log records of another strategy or world size"
  json_is "$work/$s.json" '[.shard_group_size, .replicate_group_size] | @csv' "${groups[$s]}"
  compare_losses "$work/$s.jsonl" "$work/ref.jsonl" 1e-5 8
  # Clipping sees the global gradient norm, every step, as one rank does.
  log_ok "$work/$s.jsonl" 'all(.grad_norm | type == "number" and . > 0)' "$s: a record lacks grad_norm"
  jq -c '{loss: .grad_norm}' "$work/$s.jsonl" > "$work/$s.norms.jsonl"
  jq -c '{loss: .grad_norm}' "$work/ref.jsonl" > "$work/ref.norms.jsonl"
  compare_losses "$work/$s.norms.jsonl" "$work/ref.norms.jsonl" 1e-4 8
done
expect_error "unknown sharding strategy 'zero9'" "$run" -n 2 -- "$train" --preset tiny --strategy zero9
pass
