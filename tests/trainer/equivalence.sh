#!/usr/bin/env bash
# W ranks x batch B == 1 rank x batch W*B, through the trainer's own data
# order, at W = 1, 2, 3 and 4 (global batch 12); prefetch changes when
# parameters are gathered, never the result.
#
# The model is tiny with width 35 (5 heads) and context 31: its units, the
# root's 35 * (256 + 31 + 2) = 10115 elements and each block's
# 12 * 35^2 + 13 * 35 = 15155, divide by none of 2, 3 and 4, so every unit
# is padded at every W (the presets' units divide evenly by 2 and 4).
source "$(dirname "$0")/lib.sh" "$@"

make_text_data
model=(--preset tiny --width 35 --heads 5 --context 31 --data "$work/data.txt")
declare -A batch=([1]=12 [2]=6 [3]=4 [4]=3)
for w in 1 2 3 4; do
  train_run "w$w" "$w" "${model[@]}" --steps 12 --batch "${batch[$w]}"
  json_is "$work/w$w.json" .world_size "$w"
  json_is "$work/w$w.json" .steps 12
  log_ok "$work/w$w.jsonl" "all(.world_size == $w)" "w$w.jsonl: records with a world size other than $w"
done
# The units really are uneven: each rank's parameter shard holds the padded
# share, sum over units of ceil(numel / W), not numel / W.
for w in 2 3 4; do
  want=$(( 4 * ( (10115 + w - 1) / w + 2 * ((15155 + w - 1) / w) ) ))
  json_is "$work/w$w.json" '.model_state_bytes_by_kind.params | unique | @csv' "$want"
done
for w in 2 3 4; do compare_losses "$work/w$w.jsonl" "$work/w1.jsonl" 1e-5 12; done

# The defaults, and two other prefetch settings: the same losses bit for bit.
json_is "$work/w2.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'false,"pre",1,true'
train_run post 2 "${model[@]}" --steps 12 --batch 6 --forward-prefetch --backward-prefetch post
json_is "$work/post.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'true,"post",1,true'
same_losses "$work/post.jsonl" "$work/w2.jsonl" 12
train_run deep 3 "${model[@]}" --steps 12 --batch 4 --backward-prefetch none --prefetch-depth 2 --no-limit-all-gathers
json_is "$work/deep.json" '[.forward_prefetch, .backward_prefetch, .prefetch_depth, .limit_all_gathers] | @csv' 'false,"none",2,false'
same_losses "$work/deep.jsonl" "$work/w3.jsonl" 12
expect_error "unknown backward prefetch 'sideways'" "$run" -n 2 -- "$train" --preset tiny --backward-prefetch sideways

# The summary is that of the run: its final loss is the log's last.
for w in 1 2 3 4; do
  [ "$(jq -r .final_loss "$work/w$w.json")" = "$(losses "$work/w$w.jsonl" | tail -1)" ] ||
    fail "w$w: summary final_loss $(jq -r .final_loss "$work/w$w.json") is not the log's last loss"
done
# Per-rank memory figures in every record: one positive count per rank.
for w in 2 3 4; do
  log_ok "$work/w$w.jsonl" "all((.model_state_bytes | length == $w and all(type == \"number\" and . > 0)) and
                                (.peak_tensor_bytes | length == $w and all(type == \"number\" and . > 0)))" \
    "w$w.jsonl lacks per-rank memory figures"
  json_ok "$work/w$w.json" "(.model_state_bytes | length == $w) and (.peak_tensor_bytes | length == $w)" \
    "w$w.json lacks per-rank memory figures"
done
pass
