#!/usr/bin/env bash
# --no-sync with --grad-accum: a sharded-gradient strategy keeps the first
# micro-step's full gradient and reduces once, on the last micro-step,
# instead of once per micro-step. The result is the same step: the losses
# and global gradient norms of one rank with the global batch, and of the
# same run without --no-sync.
#
# Tolerances as in strategies.sh (1e-5 on losses, 1e-4 on gradient norms):
# the runs add the same terms in another order (micro-steps summed before
# the ranks' average, not after), so they differ by fp32 rounding, ~1e-7
# per step; a gradient missing one micro-step differs in the first digit.
# --clip-grad-norm 1000 only reports the norm: tiny's stays below 10.
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
common=(--preset tiny --steps 8 --data "$work/data.txt" --clip-grad-norm 1000)
train_run ref 1 "${common[@]}" --batch 12
jq -c '{loss: .grad_norm}' "$work/ref.jsonl" > "$work/ref.norms.jsonl"
# full_shard at W = 2 and shard_grad_op at W = 3 (its units padded), each
# with and without --no-sync: 2 micro-steps per step, global batch 12.
for cfg in "full_shard 2 3" "shard_grad_op 3 2"; do
  read -r strategy ranks batch <<<"$cfg"
  for sync in synced no-sync; do
    name="$strategy-$sync"
    flags=(); [ "$sync" = synced ] || flags=(--no-sync)
    train_run "$name" "$ranks" "${common[@]}" --strategy "$strategy" --batch "$batch" --grad-accum 2 "${flags[@]}"
    json_is "$work/$name.json" '[.strategy, .world_size] | @csv' "\"$strategy\",$ranks"
    compare_losses "$work/$name.jsonl" "$work/ref.jsonl" 1e-5 8
    log_ok "$work/$name.jsonl" 'all(.grad_norm | type == "number" and . > 0 and . < 1000)' "$name: a record lacks grad_norm, or it clipped"
    jq -c '{loss: .grad_norm}' "$work/$name.jsonl" > "$work/$name.norms.jsonl"
    compare_losses "$work/$name.norms.jsonl" "$work/ref.norms.jsonl" 1e-4 8
  done
  compare_losses "$work/$strategy-no-sync.jsonl" "$work/$strategy-synced.jsonl" 1e-5 8
  # --no-sync took effect: each step reduce-scatters half the bytes (one
  # micro-step of two), and gathers as many.
  log_is "$work/$strategy-synced.jsonl" '[.[].comm_bytes.reduce_scatter] | unique | length' 1
  paste <(jq '.comm_bytes.reduce_scatter' "$work/$strategy-no-sync.jsonl") <(jq '.comm_bytes.reduce_scatter' "$work/$strategy-synced.jsonl") |
    awk '{ if ($1 <= 0 || 2 * $1 != $2) { printf "step %d: no-sync reduce-scattered %s bytes, synced %s\n", NR, $1, $2; bad = 1 } }
         END { exit bad || NR != 8 }' || fail "$strategy: --no-sync did not halve the reduce-scattered bytes"
  echo "ok: $strategy at W = $ranks: --no-sync reduce-scatters $(jq -s '.[0].comm_bytes.reduce_scatter' "$work/$strategy-no-sync.jsonl") bytes a step, synced $(jq -s '.[0].comm_bytes.reduce_scatter' "$work/$strategy-synced.jsonl")"
done
pass
