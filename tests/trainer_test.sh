#!/usr/bin/env bash
# End-to-end tests of the tools as a user runs them: fsdp-run + fsdp-train.
#   trainer_test.sh BUILD_DIR CASE
# Only the cases not yet moved to one file each in trainer/ (auto,
# ckpt-tool, planner); the others are trainer/CASE.sh.
set -uo pipefail
build="$1"
case_name="$2"
work=$(mktemp -d /tmp/fsdp_trainer_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
run="$build/fsdp-run"
train="$build/fsdp-train"

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_error "text the message must contain" COMMAND...: the command must
# exit non-zero and print the text.
expect_error() {
  local want="$1"; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "expected a non-zero exit from: $*"
  grep -qF -- "$want" <<<"$out" || { echo "$out" >&2; fail "message lacks '$want'"; }
  echo "ok: '$want' (exit $rc)"
}

# Overwrites one byte in the data section of a file (100 bytes from its end).
corrupt_byte() { printf 'X' | dd of="$1" bs=1 seek=$(( $(stat -c %s "$1") - 100 )) conv=notrunc 2>/dev/null; }

# The "loss" values of a JSON-lines log, one per line.
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }

case "$case_name" in
  auto)
    # --strategy auto picks the lightest strategy whose model state plus the
    # parameters it gathers fits. tiny at W = 4 (units of 18,560 and 2 x 49,984
    # elements): no_shard 1,896,448 B; zero1 1,185,280 B; shard_grad_op
    # 474,112 + 474,112 gathered = 948,224 B; full_shard 474,112 + 274,112 = 748,224 B.
    pick() {
      out=$("$run" -n 4 -- "$train" --preset tiny --steps 1 --strategy auto --memory-budget "$1" 2>&1) || { echo "$out"; fail "auto run failed"; }
      grep -q "auto picked $2," <<<"$out" || { echo "$out"; fail "a budget of $1 did not pick $2"; }
    }
    pick 2000000 no_shard
    pick 1200000 zero1
    pick 1000000 shard_grad_op
    pick 800000 full_shard
    grep -q "model state 0.45 MiB" <<<"$out" || { echo "$out"; fail "the measured model state is not the predicted 474,112 B"; }
    expect_error "no strategy fits a per-rank model state of 1000 bytes" "$run" -n 4 -- "$train" --preset tiny --strategy auto --memory-budget 1000
    expect_error "--strategy auto needs --memory-budget" "$run" -n 2 -- "$train" --preset tiny --strategy auto
    ;;
  ckpt-tool)
    # fsdp-ckpt inspects, verifies and converts without starting any rank.
    ckpt="$build/fsdp-ckpt"
    "$run" -n 4 -- "$train" --preset tiny --steps 3 --strategy zero1 --ckpt-dir "$work/ck" --ckpt-every 3 \
      --save-final "$work/direct.safetensors" >/dev/null 2>&1 || fail "training failed"
    out=$("$ckpt" inspect "$work/ck/step-3") || fail "inspect failed"
    grep -q "step 3, saved by 4 ranks with zero1 (4 shards), AdamW step 3" <<<"$out" || { echo "$out"; fail "inspect lacks the layout"; }
    grep -q "transformer.h.1.mlp.c_fc.weight .* F32 \[256, 64\] 65536 B" <<<"$out" || { echo "$out"; fail "inspect lacks a tensor"; }
    "$ckpt" verify "$work/ck/step-3" | grep -q "checksums match" || fail "verify of a good checkpoint failed"
    "$ckpt" verify "$work/direct.safetensors" | grep -q "checksum matches" || fail "verify of a full weights file failed"
    "$ckpt" convert "$work/ck/step-3" "$work/converted.safetensors" >/dev/null || fail "convert failed"
    "$ckpt" inspect "$work/converted.safetensors" | grep -q "28 tensors, 118528 elements" || fail "converted file incomplete"
    # The converted file holds the same weights as the trainer's own full save.
    a=$("$run" -n 1 -- "$train" --preset tiny --steps 1 --init-from "$work/converted.safetensors" --log "$work/a.jsonl" >/dev/null 2>&1 && losses "$work/a.jsonl")
    b=$("$run" -n 1 -- "$train" --preset tiny --steps 1 --init-from "$work/direct.safetensors" --log "$work/b.jsonl" >/dev/null 2>&1 && losses "$work/b.jsonl")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "converted weights differ from the saved ones ($a vs $b)"
    # The same run with full checkpoints: its model file is a weights file
    # as it is, and converting the checkpoint gives the same weights.
    "$run" -n 4 -- "$train" --preset tiny --steps 3 --strategy zero1 --ckpt-dir "$work/ckf" --ckpt-every 3 --ckpt-format full \
      >/dev/null 2>&1 || fail "training with full checkpoints failed"
    out=$("$ckpt" inspect "$work/ckf/step-3") || fail "inspect of a full checkpoint failed"
    grep -q "^full checkpoint" <<<"$out" && grep -q "step 3, saved by 4 ranks with zero1, AdamW step 3" <<<"$out" ||
      { echo "$out"; fail "inspect lacks the full layout"; }
    "$ckpt" verify "$work/ckf/step-3" | grep -q "2 files, checksums match" || fail "verify of a full checkpoint failed"
    "$ckpt" convert "$work/ckf/step-3" "$work/from-full.safetensors" >/dev/null || fail "convert of a full checkpoint failed"
    for f in "$work/from-full.safetensors" "$work/ckf/step-3/model.safetensors"; do
      c=$("$run" -n 1 -- "$train" --preset tiny --steps 1 --init-from "$f" --log "$work/c.jsonl" >/dev/null 2>&1 && losses "$work/c.jsonl")
      [ "$c" = "$b" ] || fail "$f differs from the saved weights ($c vs $b)"
    done
    corrupt_byte "$work/ck/step-3/shard-2.safetensors"
    expect_error "shard-2.safetensors' is corrupt" "$ckpt" verify "$work/ck/step-3"
    corrupt_byte "$work/direct.safetensors"
    expect_error "direct.safetensors' is corrupt" "$ckpt" verify "$work/direct.safetensors"
    expect_error "direct.safetensors' is corrupt" "$run" -n 2 -- "$train" --preset tiny --steps 1 --init-from "$work/direct.safetensors"
    expect_error "is not a complete checkpoint" "$ckpt" convert "$work" "$work/x.safetensors"
    [ ! -e "$work/x.safetensors" ] || fail "a failed convert left a file"
    ;;
  planner)
    # fsdp-plan against real runs: the model state to the byte, the peak
    # within 15% (measured: within 8% for the presets); the textbook 70B
    # table; a recommendation for a budget; a calibrated step-time estimate.
    plan="$build/fsdp-plan"
    for cfg in "tiny 2 full_shard" "tiny 4 zero1" "small 2 no_shard" "small 2 full_shard --activation-checkpointing" \
               "small 2 full_shard --activation-checkpointing --wrap sublayer"; do
      read -r preset world strategy extra <<<"$cfg"
      "$run" -n "$world" -- "$train" --preset "$preset" --steps 2 --strategy "$strategy" $extra --summary "$work/s.json" \
        > "$work/s.out" 2>&1 || { cat "$work/s.out"; fail "$cfg: run failed"; }
      measured_state=$(jq '.model_state_bytes[0]' "$work/s.json")
      planned_state=$("$plan" --preset "$preset" --world "$world" --strategy "$strategy" $extra | sed -n "s/.*measures it: $strategy \([0-9]*\))/\1/p")
      [ "$measured_state" = "$planned_state" ] || fail "$cfg: model state measured $measured_state, planned $planned_state"
      jq -e '(.peak_tensor_bytes | max) as $m | (.peak_tensor_bytes_predicted - $m) / $m | fabs < 0.15' "$work/s.json" >/dev/null ||
        fail "$cfg: peak measured $(jq -c .peak_tensor_bytes "$work/s.json"), planned $(jq .peak_tensor_bytes_predicted "$work/s.json")"
      echo "ok: $cfg: model state $measured_state B as planned; peak $(jq '.peak_tensor_bytes | max' "$work/s.json") B measured, $(jq .peak_tensor_bytes_predicted "$work/s.json") B planned"
    done
    out=$("$plan" --params 70e9 --layers 80 --width 8192 --world 8 --param-dtype bf16 --seed-accounting) || fail "70B plan failed"
    grep -q "DDP, optimizer 4 B/param  *140.0  *140.0  *280.0  *560.0" <<<"$out" || { echo "$out"; fail "no textbook DDP row"; }
    grep -q "FSDP / 8, optimizer 12 B/param  *17.5  *17.5  *105.0  *140.0" <<<"$out" || { echo "$out"; fail "no Adam FSDP row"; }
    "$plan" --preset medium --world 2 --budget 600e6 | grep -q "recommended for a budget of .*: full_shard" || fail "600 MB should need full_shard"
    "$plan" --preset medium --world 2 --budget 2e9 | grep -q "recommended for a budget of .*: no_shard" || fail "2 GB should allow no_shard"
    "$run" -n 2 -- "$plan" calibrate > "$work/cluster.json" 2>"$work/cal.err" || { cat "$work/cal.err"; fail "calibrate failed"; }
    jq -e '.flops > 0 and .intra_node_bandwidth > 0' "$work/cluster.json" >/dev/null || fail "calibration wrote no figures"
    "$plan" --preset medium --world 2 --cluster "$work/cluster.json" | grep -q "full_shard .* scaling efficiency [0-9]*%" || fail "no step-time estimate"
    expect_error "give --preset or --params" "$plan" --world 2
    expect_error "--offload must be none or cpu" "$plan" --preset tiny --offload disk
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
