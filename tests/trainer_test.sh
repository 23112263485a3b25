#!/usr/bin/env bash
# End-to-end tests of the tools as a user runs them: fsdp-run + fsdp-train.
#   trainer_test.sh BUILD_DIR CASE
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

# Fails unless two loss columns agree to a relative tolerance.
compare_losses() {
  local a="$1" b="$2" tol="$3"
  [ "$(losses "$a" | wc -l)" -eq "$(losses "$b" | wc -l)" ] || fail "logs differ in length"
  paste <(losses "$a") <(losses "$b") | awk -v tol="$tol" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r;
      if (r > tol) { printf "step %d: %s vs %s (relative %.2e > %.0e)\n", NR, $1, $2, r, tol; bad = 1 } }
    END { printf "worst relative difference %.2e over %d steps\n", worst, NR; exit bad }' || fail "losses differ"
}

case "$case_name" in
  equivalence)
    # W ranks x batch B == 1 rank x batch W*B, through the trainer's own data order.
    head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"
    "$run" -n 1 -- "$train" --preset tiny --steps 12 --batch 4 --data "$work/data.txt" --log "$work/w1.jsonl" > "$work/out1" 2>&1 || { cat "$work/out1"; fail "W=1 run failed"; }
    "$run" -n 2 -- "$train" --preset tiny --steps 12 --batch 2 --data "$work/data.txt" --log "$work/w2.jsonl" > "$work/out2" 2>&1 || { cat "$work/out2"; fail "W=2 run failed"; }
    "$run" -n 4 -- "$train" --preset tiny --steps 12 --batch 1 --data "$work/data.txt" --log "$work/w4.jsonl" > "$work/out4" 2>&1 || { cat "$work/out4"; fail "W=4 run failed"; }
    compare_losses "$work/w2.jsonl" "$work/w1.jsonl" 1e-5
    compare_losses "$work/w4.jsonl" "$work/w1.jsonl" 1e-5
    # Prefetch changes when parameters are gathered, never the result.
    for prefetch in "--forward-prefetch --backward-prefetch post" "--backward-prefetch none --prefetch-depth 2 --no-limit-all-gathers"; do
      "$run" -n 2 -- "$train" --preset tiny --steps 12 --batch 2 --data "$work/data.txt" $prefetch --log "$work/p.jsonl" > "$work/outp" 2>&1 ||
        { cat "$work/outp"; fail "run with $prefetch failed"; }
      [ "$(losses "$work/p.jsonl")" = "$(losses "$work/w2.jsonl")" ] || fail "$prefetch changed the losses"
    done
    expect_error "unknown backward prefetch 'sideways'" "$run" -n 2 -- "$train" --preset tiny --backward-prefetch sideways
    grep -q "== summary ==" "$work/out2" || fail "no summary printed"
    grep -q '"model_state_bytes":\[[0-9]*,[0-9]*\]' "$work/w2.jsonl" || fail "log lacks per-rank model_state_bytes"
    grep -q '"peak_tensor_bytes":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*\]' "$work/w4.jsonl" || fail "log lacks per-rank peak_tensor_bytes"
    ;;
  save-and-init)
    # --save-final writes the spec's names; --init-from reads them back, and
    # a model started from the saved weights continues where training ended.
    "$run" -n 2 -- "$train" --preset tiny --steps 3 --save-final "$work/final.safetensors" --log "$work/a.jsonl" >/dev/null 2>&1 ||
      fail "training with --save-final failed"
    [ -s "$work/final.safetensors" ] || fail "no weights written"
    for name in transformer.wte.weight transformer.wpe.weight transformer.h.1.mlp.c_proj.bias transformer.ln_f.weight; do
      head -c 4096 "$work/final.safetensors" | grep -q "\"$name\"" || fail "saved file lacks $name"
    done
    ! head -c 4096 "$work/final.safetensors" | grep -q '"lm_head.weight"' || fail "the tied head was saved twice"
    "$run" -n 4 -- "$train" --preset tiny --steps 1 --init-from "$work/final.safetensors" --log "$work/b.jsonl" >/dev/null 2>&1 ||
      fail "--init-from of a saved file failed"
    "$run" -n 4 -- "$train" --preset tiny --steps 1 --log "$work/c.jsonl" >/dev/null 2>&1 || fail "fresh run failed"
    # From the trained weights, step 1's loss is below a fresh model's.
    awk -v a="$(losses "$work/b.jsonl")" -v b="$(losses "$work/c.jsonl")" 'BEGIN { exit !(a < b - 0.05) }' ||
      fail "loss from the saved weights ($(losses "$work/b.jsonl")) is not below a fresh start's ($(losses "$work/c.jsonl"))"
    # Mixed precision saves the fp32 masters, under the same names.
    "$run" -n 2 -- "$train" --preset tiny --steps 2 --param-dtype bf16 --strategy zero1 --save-final "$work/bf16.safetensors" >/dev/null 2>&1 ||
      fail "--save-final with bf16 params failed"
    head -c 4096 "$work/bf16.safetensors" | grep -q '"transformer.wte.weight":{"dtype":"F32"' || fail "bf16 run did not save fp32 masters"
    "$run" -n 1 -- "$train" --preset tiny --steps 1 --init-from "$work/bf16.safetensors" >/dev/null 2>&1 || fail "reloading the bf16 run's file failed"
    echo "ok: saved and reloaded"
    ;;
  bad-input)
    printf 'short' > "$work/short.txt"
    expect_error "holds 5 tokens, too few for one training sequence" "$run" -n 2 -- "$train" --preset tiny --data "$work/short.txt" --log "$work/never.jsonl"
    [ ! -e "$work/never.jsonl" ] || fail "a failed run left a log file"
    expect_error "cannot open data file" "$run" -n 2 -- "$train" --preset tiny --data "$work/missing.txt"
    expect_error "--bogus" "$run" -n 2 -- "$train" --bogus
    expect_error "unknown preset 'enormous'" "$run" -n 2 -- "$train" --preset enormous
    expect_error "must be a multiple of the number of heads" "$run" -n 2 -- "$train" --preset tiny --heads 3
    # Init files: a missing tensor and a mis-shaped one (saved from another config).
    "$run" -n 2 -- "$train" --preset tiny --layers 1 --steps 1 --save-final "$work/one_layer.safetensors" >/dev/null 2>&1 ||
      fail "could not make a 1-layer file"
    expect_error "has no tensor 'transformer.h.1.ln_1.weight'" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/one_layer.safetensors" --save-final "$work/never.safetensors"
    "$run" -n 2 -- "$train" --preset tiny --width 32 --heads 4 --steps 1 --save-final "$work/narrow.safetensors" >/dev/null 2>&1 ||
      fail "could not make a narrow file"
    expect_error "tensor 'transformer.wte.weight' has shape [256, 32], expected [256, 64]" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/narrow.safetensors"
    printf 'not a safetensors file at all' > "$work/garbage.safetensors"
    expect_error "header length" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/garbage.safetensors"
    [ ! -e "$work/never.safetensors" ] && [ ! -e "$work/never.safetensors.tmp" ] || fail "a failed run left a weights file"
    expect_error "fsdp-run: -n needs a positive number of ranks" "$run" -n 0 -- "$train"
    expect_error "--ranks-per-node must be a positive divisor of -n 4" "$run" -n 4 --ranks-per-node 3 -- "$train"
    ;;
  strategies)
    # Every strategy through the trainer (hybrid: 2 simulated nodes of 2),
    # with accumulation and clipping, equals one rank with the global batch.
    head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"
    common=(--preset tiny --steps 8 --data "$work/data.txt" --clip-grad-norm 0.5)
    "$run" -n 1 -- "$train" "${common[@]}" --batch 8 --log "$work/ref.jsonl" > "$work/ref.out" 2>&1 || { cat "$work/ref.out"; fail "reference run failed"; }
    for s in no_shard zero1 shard_grad_op full_shard hybrid_shard hybrid_shard_zero2; do
      "$run" -n 4 --ranks-per-node 2 -- "$train" "${common[@]}" --batch 1 --grad-accum 2 --strategy "$s" --log "$work/$s.jsonl" > "$work/$s.out" 2>&1 ||
        { cat "$work/$s.out"; fail "$s failed"; }
      grep -q "$s over 4 rank(s)" "$work/$s.out" || fail "$s: the banner does not name the strategy"
      compare_losses "$work/$s.jsonl" "$work/ref.jsonl" 1e-5
    done
    grep -q "replicate group of 2" "$work/hybrid_shard.out" || fail "hybrid_shard did not form 2 nodes"
    grep -q '"grad_norm":' "$work/full_shard.jsonl" || fail "no grad_norm in the log"
    expect_error "unknown sharding strategy 'zero9'" "$run" -n 2 -- "$train" --preset tiny --strategy zero9
    ;;
  bf16-curve)
    # bf16 training of small for 200 steps follows the fp32 loss curve: every
    # 20-step window's mean loss within 3% of fp32's. Why 3%: bf16 keeps 8
    # significant bits (0.39% rounding per operation); measured here the
    # windows differ by at most 1.6%, where the loss falls fastest. A real
    # defect (stale low-precision parameters, lost master updates, a
    # mis-scaled reduction) stalls near the initial 5.5 or drifts by far more.
    # lr 3e-4: at the spec's 1e-3 this model sits on a plateau near 3.2 and
    # leaves it at a step that rounding alone moves by tens of steps (bf16
    # left it first at batch 8, fp32 first at batch 4), which no pointwise
    # tolerance can follow.
    common=(--preset small --steps 200 --batch 4 --lr 3e-4 --print-every 50)
    "$run" -n 2 -- "$train" "${common[@]}" --param-dtype fp32 --log "$work/fp32.jsonl" > "$work/fp32.out" 2>&1 || { cat "$work/fp32.out"; fail "fp32 run failed"; }
    "$run" -n 2 -- "$train" "${common[@]}" --param-dtype bf16 --log "$work/bf16.jsonl" > "$work/bf16.out" 2>&1 || { cat "$work/bf16.out"; fail "bf16 run failed"; }
    paste <(losses "$work/bf16.jsonl") <(losses "$work/fp32.jsonl") | awk '
      { if ($1 != $1 + 0 || $1 > 100) bad = 1; a += $1; b += $2 }
      NR % 20 == 0 { r = a / b; printf "steps %3d-%3d: bf16 %.4f fp32 %.4f (ratio %.4f)\n", NR - 19, NR, a / 20, b / 20, r
                     if (r > 1.03 || r < 0.97) bad = 1; a = 0; b = 0 }
      END { exit bad || NR != 200 }' || fail "bf16 left the fp32 curve"
    grep -h "throughput" "$work/fp32.out" "$work/bf16.out"
    ;;
  watchdog)
    # A rank that never makes a collective: the others' watchdog ends the job
    # within the timeout, naming the call.
    start=$(date +%s%N)
    expect_error "collective watchdog: all_reduce(Float, 4 elements per rank, sum) (call #0 of a group of 2 ranks" \
      "$run" -n 2 -- "$build/tests/watchdog_probe" 2
    elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "stalled job ended after ${elapsed_ms} ms (timeout 2 s)"
    [ "$elapsed_ms" -lt 20000 ] || fail "the stalled job took ${elapsed_ms} ms to end"
    # A rank killed (kill -9) in the middle of training: the job ends non-zero.
    "$run" -n 2 -- "$train" --preset tiny --steps 100000 --print-every 1 --collective-timeout 10 --log "$work/kill.jsonl" > "$work/kill.out" 2>&1 &
    job=$!
    for _ in $(seq 1 100); do [ -s "$work/kill.jsonl" ] && break; sleep 0.2; done
    [ -s "$work/kill.jsonl" ] || { kill $job; fail "training did not start"; }
    victim=$(pgrep -f "fsdp-train --preset tiny --steps 100000" | tail -1)
    start=$(date +%s%N)
    kill -9 "$victim"
    status=0
    wait $job || status=$?
    elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "job ended with status $status ${elapsed_ms} ms after a rank was killed"
    [ "$status" -ne 0 ] || fail "the job exited 0 after a rank was killed"
    [ "$elapsed_ms" -lt 30000 ] || fail "the job took ${elapsed_ms} ms to end after a rank was killed"
    ;;
  checkpoint)
    # Resume is exact, in both formats: stopped at step 6 (checkpoints at 3
    # and 6) and resumed to 10 gives the uninterrupted run's losses bit for
    # bit; resumed from step 3 on other world sizes and strategies (same
    # global batch), within 1e-5.
    head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"
    common=(--preset tiny --data "$work/data.txt")
    "$run" -n 2 -- "$train" "${common[@]}" --steps 10 --log "$work/straight.jsonl" >/dev/null 2>&1 || fail "straight run failed"
    for format in sharded full; do
      ck="$work/ck-$format"
      "$run" -n 2 -- "$train" "${common[@]}" --steps 6 --ckpt-dir "$ck" --ckpt-every 3 --ckpt-format "$format" \
        --log "$work/resumed.jsonl" >/dev/null 2>&1 || fail "run with $format checkpoints failed"
      [ -f "$ck/step-3/metadata.json" ] && [ -f "$ck/step-6/metadata.json" ] || fail "$format checkpoints missing"
      cp -r "$ck/step-3" "$work/$format-step-3"  # the resume below prunes it (--ckpt-keep 2)
      out=$("$run" -n 2 -- "$train" "${common[@]}" --steps 10 --ckpt-dir "$ck" --ckpt-every 100 --ckpt-format "$format" \
        --resume --log "$work/resumed.jsonl" 2>&1) || { echo "$out"; fail "$format resume failed"; }
      grep -q "resumed from $ck/step-6 (step 6" <<<"$out" || { echo "$out"; fail "did not resume from step 6"; }
      [ "$(losses "$work/resumed.jsonl")" = "$(losses "$work/straight.jsonl")" ] || fail "$format: resumed losses differ from the uninterrupted run's"
      echo "ok: bitwise resume ($format)"
    done
    [ -f "$work/ck-full/step-6/model.safetensors" ] && [ -f "$work/ck-full/step-6/optimizer.safetensors" ] || fail "full checkpoint files missing"
    for cfg in "sharded 4 zero1 2" "sharded 4 hybrid_shard 2" "sharded 1 no_shard 8" "full 4 shard_grad_op 2"; do
      read -r format ranks strategy batch <<<"$cfg"
      rm -rf "$work/ck3" && mkdir -p "$work/ck3" && cp -r "$work/$format-step-3" "$work/ck3/step-3"
      head -3 "$work/straight.jsonl" > "$work/reshard.jsonl"
      flags=(); [ "$ranks" -eq 1 ] || flags=(--ranks-per-node 2)
      "$run" -n "$ranks" "${flags[@]}" -- "$train" "${common[@]}" --steps 10 --batch "$batch" --strategy "$strategy" \
        --ckpt-dir "$work/ck3" --resume --log "$work/reshard.jsonl" > "$work/reshard.out" 2>&1 || { cat "$work/reshard.out"; fail "resharded resume ($cfg) failed"; }
      compare_losses "$work/reshard.jsonl" "$work/straight.jsonl" 1e-5
    done
    # Bad checkpoints are refused, naming the file.
    bad_ckpt() { rm -rf "$work/ckbad" && mkdir -p "$work/ckbad" && cp -r "$work/$1-step-3" "$work/ckbad/step-3"; }
    resume_bad=("$run" -n 2 -- "$train" "${common[@]}" --steps 5 --ckpt-dir "$work/ckbad" --resume)
    bad_ckpt sharded
    corrupt_byte "$work/ckbad/step-3/shard-1.safetensors"
    expect_error "shard-1.safetensors' is corrupt: its bytes have checksum" "${resume_bad[@]}"
    rm "$work/ckbad/step-3/shard-1.safetensors"
    expect_error "is missing 'shard-1.safetensors'" "${resume_bad[@]}"
    bad_ckpt full
    corrupt_byte "$work/ckbad/step-3/model.safetensors"
    expect_error "model.safetensors' is corrupt" "${resume_bad[@]}"
    bad_ckpt full
    truncate -s -100 "$work/ckbad/step-3/optimizer.safetensors"
    expect_error "optimizer.safetensors': tensor 'transformer.h.1.mlp.c_proj.bias.exp_avg_sq': data_offsets [947968, 948224] lie outside the data section" "${resume_bad[@]}"
    bad_ckpt full
    sed -i 's/"step": 3/"step": 4/' "$work/ckbad/step-3/metadata.json"
    expect_error "metadata.json' is corrupt" "${resume_bad[@]}"
    expect_error "(another model configuration)" "$run" -n 2 -- "$train" "${common[@]}" --width 32 --steps 5 --ckpt-dir "$work/ck-full" --resume
    expect_error "unknown checkpoint format 'zip'" "$run" -n 2 -- "$train" "${common[@]}" --ckpt-dir "$work/x" --ckpt-format zip
    # A rank killed (kill -9) in the middle of a save (its second, step 4:
    # rank 1 while writing its shard; rank 0, the only writer, of a full
    # save) leaves step 2 complete and loadable, and the resumed run
    # continues exactly. Unfinished saves are ignored and later pruned.
    for cfg in "sharded 1" "full 0"; do
      read -r format victim <<<"$cfg"
      ck="$work/kill-$format"
      rm -f "$work/after-kill.jsonl"
      FSDP_TEST_KILL_IN_SAVE="$victim:2" "$run" -n 2 -- "$train" "${common[@]}" --steps 6 --ckpt-dir "$ck" --ckpt-every 2 \
        --ckpt-format "$format" > "$work/kill.out" 2>&1 && { cat "$work/kill.out"; fail "the job survived a rank killed mid-save"; }
      [ -d "$ck/step-4.tmp" ] && [ ! -e "$ck/step-4" ] && [ -f "$ck/step-2/metadata.json" ] || { ls -R "$ck"; fail "$format: not killed mid-save"; }
      "$build/fsdp-ckpt" verify "$ck/step-2" >/dev/null || fail "$format: step 2 does not verify after the kill"
      out=$("$run" -n 2 -- "$train" "${common[@]}" --steps 6 --ckpt-dir "$ck" --ckpt-every 2 --ckpt-format "$format" --resume \
        --log "$work/after-kill.jsonl" 2>&1) || { echo "$out"; fail "$format: no loadable checkpoint after the kill"; }
      grep -q "resumed from $ck/step-2 (step 2" <<<"$out" || { echo "$out"; fail "$format: did not resume from step 2"; }
      [ "$(losses "$work/after-kill.jsonl")" = "$(losses "$work/straight.jsonl" | sed -n 3,6p)" ] || fail "$format: losses after the kill differ"
      [ ! -e "$ck/step-4.tmp" ] && [ -f "$ck/step-6/metadata.json" ] || { ls "$ck"; fail "$format: the unfinished save was not replaced"; }
      echo "ok: rank $victim killed mid-save ($format): resumed from step 2, losses exact"
    done
    ;;
  trace)
    # --trace: one Chrome trace per rank with the units' forward and
    # backward, the collectives on the communication threads, the waits and
    # the optimizer; the summary splits the step.
    out=$("$run" -n 2 -- "$train" --preset tiny --steps 3 --forward-prefetch --trace "$work/t.json" 2>&1) || { echo "$out"; fail "traced run failed"; }
    grep -q "step time split .* compute .* exposed communication .* optimizer" <<<"$out" || { echo "$out"; fail "no step split in the summary"; }
    for r in 0 1; do
      f="$work/t.rank$r.json"
      [ -s "$f" ] || fail "no trace for rank $r"
      for want in '"name":"forward transformer.h.1"' '"name":"backward <root>"' '"name":"all_gather"' '"name":"reduce_scatter"' \
                  '"name":"optimizer step"' '"name":"step 3"' '"name":"compute"' '"name":"comm 1"' '"ph":"X"'; do
        grep -qF "$want" "$f" || fail "trace of rank $r lacks $want"
      done
    done
    expect_error "--trace: the directory '$work/nowhere' does not exist" "$run" -n 2 -- "$train" --preset tiny --trace "$work/nowhere/t.json"
    ;;
  activation-checkpointing)
    # Recomputing each block in backward: the same losses bit for bit, the
    # same bytes all-gathered (the recompute uses the parameters backward
    # gathered, it does not gather again), and a lower peak.
    head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"
    common=(--preset tiny --steps 4 --batch 8 --data "$work/data.txt")
    # Units per attention and per MLP (--wrap sublayer) train the same
    # model too: same losses bit for bit (at W = 2 each averaged element is
    # the same two numbers whatever the unit), twice the units.
    for ac in off on sublayer; do
      case $ac in
        off) flags=() ;;
        on) flags=(--activation-checkpointing --forward-prefetch) ;;
        sublayer) flags=(--activation-checkpointing --wrap sublayer) ;;
      esac
      "$run" -n 2 -- "$train" "${common[@]}" "${flags[@]}" --log "$work/$ac.jsonl" --summary "$work/$ac.json" > "$work/$ac.out" 2>&1 ||
        { cat "$work/$ac.out"; fail "run with activation checkpointing $ac failed"; }
    done
    grep -q "activation checkpointing on" "$work/on.out" || fail "the banner does not show activation checkpointing"
    [ "$(losses "$work/on.jsonl")" = "$(losses "$work/off.jsonl")" ] || fail "activation checkpointing changed the losses"
    grep -q "5 units (wrap sublayer)" "$work/sublayer.out" || { cat "$work/sublayer.out"; fail "sublayer wrapping did not make 5 units"; }
    [ "$(losses "$work/sublayer.jsonl")" = "$(losses "$work/off.jsonl")" ] || fail "sublayer units changed the losses"
    expect_error "--wrap must be block or sublayer, got 'layer'" "$run" -n 2 -- "$train" --preset tiny --wrap layer
    gathered() { sed -n 's/.*"all_gather":\([0-9]*\).*/\1/p' "$1" | tail -1; }
    [ "$(gathered "$work/on.jsonl")" = "$(gathered "$work/off.jsonl")" ] ||
      fail "all-gather bytes per step differ: $(gathered "$work/on.jsonl") with recompute, $(gathered "$work/off.jsonl") without"
    peak() { sed -n 's/.*"peak_tensor_bytes":\[\([0-9]*\).*/\1/p' "$1"; }
    echo "peak tensor bytes: $(peak "$work/off.json") without, $(peak "$work/on.json") with activation checkpointing"
    [ "$(peak "$work/on.json")" -lt "$(peak "$work/off.json")" ] || fail "activation checkpointing did not lower the peak"
    ;;
  sharded-init)
    # Built without memory for its weights and initialized unit by unit:
    # the same model (bitwise the same losses), a lower construction peak.
    head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"
    for si in off on; do
      flags=(); [ "$si" = off ] || flags=(--sharded-init)
      "$run" -n 2 -- "$train" --preset small --steps 2 --batch 1 --data "$work/data.txt" "${flags[@]}" --log "$work/$si.jsonl" \
        --summary "$work/$si.json" > "$work/$si.out" 2>&1 || { cat "$work/$si.out"; fail "run with sharded init $si failed"; }
    done
    [ "$(losses "$work/on.jsonl")" = "$(losses "$work/off.jsonl")" ] || fail "sharded initialization changed the model"
    built() { sed -n 's/.*"construction_peak_bytes":\([0-9]*\).*/\1/p' "$1"; }
    echo "construction peak: $(built "$work/off.json") B built whole, $(built "$work/on.json") B with sharded initialization"
    [ "$(built "$work/on.json")" -lt "$(built "$work/off.json")" ] || fail "sharded initialization did not lower the construction peak"
    expect_error "--sharded-init draws the initial weights unit by unit; it cannot be combined with --init-from" \
      "$run" -n 2 -- "$train" --preset tiny --sharded-init --init-from "$work/x.safetensors"
    ;;
  plot)
    # --plot: the loss and memory PNGs from the log; fsdp-plot refuses what is not a log.
    out=$("$run" -n 2 -- "$train" --preset tiny --steps 5 --plot "$work/plots" 2>&1) || { echo "$out"; fail "run with --plot failed"; }
    for f in loss memory; do
      [ "$(head -c 4 "$work/plots/$f.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$f.png is not a PNG"
    done
    [ "$(wc -l < "$work/plots/log.jsonl")" -eq 5 ] || fail "--plot did not keep its log"
    printf 'not json\n' > "$work/bad.jsonl"
    expect_error "is not an fsdp-train log" "$build/fsdp-plot" "$work/bad.jsonl" "$work/p2"
    expect_error "the log '$work/none.jsonl' is missing or empty" "$build/fsdp-plot" "$work/none.jsonl" "$work/p2"
    ;;
  bench-smoke)
    # The benchmark suite end to end on tiny: every variant runs, and the
    # table shows each with the planner's model state equal to the measured.
    FSDP_BUILD="$(cd "$build" && pwd)" "$(dirname "$0")/../bench/suite.sh" --preset tiny --steps 2 --out "$work/suite" > "$work/suite.out" 2>&1 ||
      { cat "$work/suite.out"; fail "the benchmark suite failed"; }
    cat "$work/suite.out"
    [ "$(wc -l < "$work/suite/results.jsonl")" -eq 13 ] || fail "expected 13 result lines"
    for v in local no_shard no_shard_ac no_shard_bf16 zero1 shard_grad_op full_shard full_shard_noprefetch full_shard_ac \
             full_shard_bf16 full_shard_lowmem no_shard_w4 full_shard_w4; do
      line=$(grep "^$v " "$work/suite/table.txt") || fail "no row for $v"
      read -r measured predicted <<<"$(sed -E 's/.* ([0-9]+) \/ ([0-9]+) .*/\1 \2/' <<<"$line")"
      [ "$measured" = "$predicted" ] || fail "$v: measured model state $measured, planner $predicted"
    done
    ;;
  launcher)
    # The exit status passes through, and threads per rank = cores / ranks.
    "$run" -n 2 -- true || fail "fsdp-run of true failed"
    ! "$run" -n 2 -- false || fail "fsdp-run of false succeeded"
    threads=$("$run" -n 1 -- printenv OMP_NUM_THREADS)
    [ "$threads" = "$(nproc)" ] || fail "1 rank got $threads threads, expected $(nproc)"
    many=$(( $(nproc) * 2 ))
    [ "$("$run" -n "$many" -- printenv OMP_NUM_THREADS | sort -u)" = 1 ] || fail "oversubscribed ranks did not get 1 thread"
    # MPI yields the core while it waits (the communication thread's busy-poll
    # would take it from the compute threads).
    [ "$("$run" -n 2 -- printenv OMPI_MCA_mpi_yield_when_idle | sort -u)" = 1 ] || fail "MPI does not yield when idle"
    echo "ok: launcher"
    ;;
  example)
    out=$("$run" -n 2 -- "$build/example-mlp" 2>&1) || { echo "$out"; fail "example failed"; }
    echo "$out"
    grep -q "rank 1 of 2 holds" <<<"$out" || fail "example did not report its shards"
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
