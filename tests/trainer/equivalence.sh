#!/usr/bin/env bash
# W ranks x batch B == 1 rank x batch W*B, through the trainer's own data
# order; prefetch changes when parameters are gathered, never the result.
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
train_run w1 1 --preset tiny --steps 12 --batch 4 --data "$work/data.txt"
train_run w2 2 --preset tiny --steps 12 --batch 2 --data "$work/data.txt"
train_run w4 4 --preset tiny --steps 12 --batch 1 --data "$work/data.txt"
for w in 1 2 4; do
  json_is "$work/w$w.json" .world_size "$w"
  json_is "$work/w$w.json" .steps 12
  log_ok "$work/w$w.jsonl" "all(.world_size == $w)" "w$w.jsonl: records with a world size other than $w"
done
compare_losses "$work/w2.jsonl" "$work/w1.jsonl" 1e-5 12
compare_losses "$work/w4.jsonl" "$work/w1.jsonl" 1e-5 12

# The defaults, and two other prefetch settings: the same losses bit for bit.
json_is "$work/w2.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'false,"pre",1,true'
train_run post 2 --preset tiny --steps 12 --batch 2 --data "$work/data.txt" --forward-prefetch --backward-prefetch post
json_is "$work/post.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'true,"post",1,true'
same_losses "$work/post.jsonl" "$work/w2.jsonl" 12
train_run deep 2 --preset tiny --steps 12 --batch 2 --data "$work/data.txt" --backward-prefetch none --prefetch-depth 2 --no-limit-all-gathers
json_is "$work/deep.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'false,"none",2,false'
same_losses "$work/deep.jsonl" "$work/w2.jsonl" 12
expect_error "unknown backward prefetch 'sideways'" "$run" -n 2 -- "$train" --preset tiny --backward-prefetch sideways

# The summary is that of the run: its final loss is the log's last.
for w in 1 2 4; do
  [ "$(jq -r .final_loss "$work/w$w.json")" = "$(losses "$work/w$w.jsonl" | tail -1)" ] ||
    fail "w$w: summary final_loss $(jq -r .final_loss "$work/w$w.json") is not the log's last loss"
done
# Per-rank memory figures in every record: one positive count per rank.
log_ok "$work/w2.jsonl" 'all(.model_state_bytes | length == 2 and all(type == "number" and . > 0))' \
  "w2.jsonl lacks per-rank model_state_bytes"
log_ok "$work/w4.jsonl" 'all(.peak_tensor_bytes | length == 4 and all(type == "number" and . > 0))' \
  "w4.jsonl lacks per-rank peak_tensor_bytes"
json_ok "$work/w4.json" '(.model_state_bytes | length == 4) and (.peak_tensor_bytes | length == 4)' \
  "w4.json lacks per-rank memory figures"
pass
