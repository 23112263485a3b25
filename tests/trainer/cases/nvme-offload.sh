# --offload-optimizer nvme / --offload-params nvme (ZeRO-Infinity): the
# offloaded state lives in a scratch file per rank between uses, and the run
# equals the same run in memory bit for bit: zero1, full_shard and hybrid at
# W = 2 over 5 steps (losses and the step-5 checkpoint's files), fp32 and bf16, both
# checkpoint formats; through a resume and a reshard (W = 2 -> 1 and 4). The
# planner's disk figures are the run's, and the summary splits the I/O
# thread's time into copies, checksums and the disk; a clipped run's trace
# shows each gradient written out and read back. Faults leave the last checkpoint
# loadable: a corrupted scratch block and a truncated scratch file (clear
# errors naming the file and the offset), and a rank killed in the middle
# of a swap. Scratch files never outlive their run, however it ends.

scratch="$work/scratch"
mkdir -p "$scratch"
base=(--preset tiny --weight-decay 0.1)
common=("${base[@]}" --steps 5)
no_scratch_left() { [ -z "$(ls -A "$scratch")" ] || fail "scratch files left behind: $(ls "$scratch")"; }
same_checkpoint() {  # DIR_A DIR_B: the same tensor files, bit for bit
  local f n=0
  for f in "$1"/*.safetensors; do same_safetensors "$f" "$2/$(basename "$f")"; n=$((n + 1)); done
  [ "$n" -gt 0 ] || fail "$1 holds no safetensors files"
}

# In memory and offloaded, one run per path the trainer takes: the optimizer
# state alone (zero1), with the parameters (full_shard; bf16 with a full
# checkpoint), on a hybrid group. (full_shard offloaded equals memory in
# fp32 and bf16: DiskOffload.EqualsMemoryThroughEvaluationAndStateDictLoads.)
# Without clipping, the sharded strategies step each unit during backward
# (clip0), and the planner's disk traffic counts the master the backward
# gather read once for the step; clipped, they write each gradient out as
# it arrives and step each unit before its next gather, and the planner
# counts the gradients' traffic. Either way no gradient shard is left after
# the step and no optimizer phase waits on the disk (zero1 keeps whole
# gradients and steps after backward).
for cfg in "zero1 bf16 sharded 1" "full_shard fp32 sharded 1" "full_shard bf16 full 1" "hybrid_shard_zero2 bf16 sharded 1" \
           "full_shard fp32 sharded 0" "hybrid_shard_zero2 bf16 sharded 0"; do
  read -r strategy dtype format clip <<<"$cfg"
  launcher=(); case "$strategy" in hybrid*) launcher=(--ranks-per-node 1 --) ;; esac
  offload=(--offload-optimizer nvme --offload-dir "$scratch")
  case "$strategy" in no_shard|zero1) ;; *) offload+=(--offload-params nvme) ;; esac
  args=("${common[@]}" --strategy "$strategy" --param-dtype "$dtype" --ckpt-format "$format" --clip-grad-norm "$clip")
  name="$strategy-$dtype"
  [ "$clip" = 0 ] && name+="-clip0"
  train_run "mem-$name" 2 "${launcher[@]}" "${args[@]}" --ckpt-dir "$work/ck-mem-$name"
  trace=(); [ "$name" = full_shard-fp32 ] && trace=(--trace "$work/trace-$name.json")
  # The planner's peak below is for 2 units read ahead: that run's read-ahead
  # stays there; the others' may deepen where compute waited on the disk.
  [ "$name" = full_shard-fp32 ] && offload+=(--offload-read-ahead-max 2)
  train_run "nvme-$name" 2 "${launcher[@]}" "${args[@]}" --ckpt-dir "$work/ck-nvme-$name" "${offload[@]}" "${trace[@]}"
  same_losses "$work/nvme-$name.jsonl" "$work/mem-$name.jsonl" 5
  same_checkpoint "$work/ck-mem-$name/step-5" "$work/ck-nvme-$name/step-5"
  s="$work/nvme-$name.json"
  json_ok "$s" '.offload_optimizer == "nvme" and .offload_file_bytes == .offload_file_bytes_predicted and
                .offload_file_bytes > 0' "$name: the scratch file is not the planner's size: $(jq -c '[.offload_file_bytes, .offload_file_bytes_predicted]' "$s")"
  json_ok "$s" '.offload_read_bytes_per_step + .offload_written_bytes_per_step == .offload_io_bytes_per_step_predicted' \
    "$name: the step's disk traffic is not the planner's: $(jq -c '[.offload_read_bytes_per_step, .offload_written_bytes_per_step, .offload_io_bytes_per_step_predicted]' "$s")"
  # The I/O thread's time by cause: it checksums and waits on the disk every step.
  json_ok "$s" '.offload_io_thread_s | .checksum > 0 and .disk > 0 and .copy >= 0' \
    "$name: the I/O thread's seconds by cause: $(jq -c .offload_io_thread_s "$s")"
  # Between steps the offloaded state is not in memory.
  json_ok "$s" '.model_state_bytes_by_kind.optimizer | all(. == 0)' "$name: optimizer state left in memory: $(jq -c .model_state_bytes_by_kind "$s")"
  if [ "$strategy" != zero1 ]; then
    json_ok "$s" '.model_state_bytes_by_kind.grads | all(. == 0)' "$name: stepped overlapping compute, yet gradients left in memory: $(jq -c .model_state_bytes_by_kind "$s")"
    json_ok "$s" '.offload_wait_s >= 0 and .optimizer_s < 0.5 * .step_s' "$name: the optimizer still waits in a phase: $(jq -c '[.optimizer_s, .step_s]' "$s")"
  fi
  # The read-ahead starts at 2 units, and grows by one after a step from the
  # second on in which compute waited on the disk for 2 % of it, up to 4
  # (this host has room for 4; full_shard-fp32 is held at 2).
  max=4; [ "$name" = full_shard-fp32 ] && max=2
  json_is "$s" .offload_read_ahead_max "$max"
  json_ok "$s" "(.ram_bytes_predicted_read_ahead_max >= .ram_bytes_predicted) and ($max > 2 or .ram_bytes_predicted_read_ahead_max == .ram_bytes_predicted)" \
    "$name: the preflight's plan at the deepest read-ahead: $(jq -c '[.ram_bytes_predicted, .ram_bytes_predicted_read_ahead_max]' "$s")"
  jq -s -e --argjson max "$max" '[.[] | select(has("offload_read_ahead")) | .offload_read_ahead] as $d | ($d | length) == 5 and
        $d[0] == 2 and $d[1] == 2 and all(range(1; 5); $d[.] - $d[. - 1] == 0 or $d[.] - $d[. - 1] == 1) and ($d | max) <= $max' \
    "$work/nvme-$name.jsonl" > /dev/null || fail "$name: the units read ahead by step: $(jq -s -c '[.[] | .offload_read_ahead]' "$work/nvme-$name.jsonl")"
  if [ "$name" = full_shard-fp32 ]; then
    # Stepping before the next gather: the planner's peak is the larger of
    # forward (the units stepping ahead) and backward (two gradients being
    # written out), not their sum: never below the measured peak, and
    # within 12 % of it at this size (within 0.5 % at medium and xl, W = 4).
    json_ok "$s" '(.peak_tensor_bytes | max) as $m | .peak_tensor_bytes_predicted as $p | $p >= $m and ($p - $m) / $m < 0.12' \
      "$name: the planner's peak against the measured: $(jq -c '[.peak_tensor_bytes, .peak_tensor_bytes_predicted]' "$s")"
  fi
  if [ "${#trace[@]}" -gt 0 ]; then
    # Clipped: each unit's gradient written in backward and read back for its
    # update (by the next step's gather, the last one by the final
    # checkpoint), on the I/O thread, as the trace shows.
    t="$work/trace-$name.rank0.json"
    json_ok "$t" '[.traceEvents[] | select(.name == "write unit 1 grad" or .name == "read unit 1 grad") | .tid] | length == 10 and (unique | length == 1)' \
      "$name: the trace lacks unit 1's gradient written in each of 5 steps and read back 5 times, on one thread: $(jq -c '[.traceEvents[] | select(.name | test("grad")) | .name] | group_by(.) | map([.[0], length])' "$t")"
  fi
  no_scratch_left
  echo "ok: $name offloaded equals in memory bit for bit"
done
# Room for the gradients in the scratch file only where a step writes them
# out: clipped, not unclipped (both at the planner's size, above).
unclipped=$(jq .offload_file_bytes "$work/nvme-full_shard-fp32-clip0.json")
clipped=$(jq .offload_file_bytes "$work/nvme-full_shard-fp32.json")
[ "$unclipped" -lt "$clipped" ] || fail "an unclipped run's scratch file ($unclipped bytes) is not smaller than a clipped one's ($clipped)"
# fsdp-plan --offload nvme gives the run's scratch file and disk traffic, and
# with a cluster file's disk bandwidths the I/O seconds (the host's
# bandwidth shared by its ranks).
plan="$build/fsdp-plan"
cat > "$work/cluster.json" <<'JSON'
{"flops": 1e11, "intra_node_bandwidth": 1e10, "intra_node_latency": 1e-5, "inter_node_bandwidth": 1e9,
 "inter_node_latency": 1e-4, "disk_read_bandwidth": 2e9, "disk_write_bandwidth": 1e9}
JSON
"$plan" --preset tiny --world 2 --strategy full_shard --offload nvme --cluster "$work/cluster.json" --json \
  > "$work/plan.json" || fail "fsdp-plan --offload nvme failed"
s="$work/nvme-full_shard-fp32.json"
json_is "$work/plan.json" '.strategies[0].nvme.file_bytes' "$(jq .offload_file_bytes "$s")"
json_is "$work/plan.json" '.strategies[0].nvme.read_bytes_per_step' "$(jq .offload_read_bytes_per_step "$s")"
json_is "$work/plan.json" '.strategies[0].nvme.written_bytes_per_step' "$(jq .offload_written_bytes_per_step "$s")"
json_ok "$work/plan.json" '.strategies[0].nvme as $n | (($n.read_bytes_per_step * 2 / 2e9 + $n.written_bytes_per_step * 2 / 1e9) - $n.io_s_per_step | fabs) < 1e-9' \
  "the I/O time is not the bytes over the host's bandwidth shared by 2 ranks: $(jq -c '.strategies[0].nvme' "$work/plan.json")"
"$plan" --preset tiny --world 2 --offload nvme > "$work/plan.txt" || fail "fsdp-plan --offload nvme (table) failed"
grep -q "with nvme offload" "$work/plan.txt" || { cat "$work/plan.txt"; fail "no nvme table"; }
expect_error "--offload must be none, cpu, nvme or nvme-optimizer" "$plan" --preset tiny --offload disk

grep -q "nvme offload: optimizer state and parameters in $scratch/fsdp-offload-rank0.bin (libaio, O_DIRECT" \
  "$work/nvme-full_shard-fp32.out" || { cat "$work/nvme-full_shard-fp32.out"; fail "the engine is not printed"; }

# Frozen parameters on disk (LoRA's base, --freeze): a unit's frozen part
# has the parameters' slots only, is read by its gathers and never
# stepped. A Llama with LoRA r = 8 at W = 2 (clipped: its adapters' update
# waits for their next gather) and a GPT with its first block frozen at
# W = 3 (unclipped: the adapters step in backward) equal the same runs in
# memory bit for bit; fsdp-plan plans the LoRA run's scratch file, disk
# traffic and resident model state to the byte.
offload=(--offload-optimizer nvme --offload-params nvme --offload-dir "$scratch")
for cfg in "lora 2 --model llama --lora-rank 8 --clip-grad-norm 1" "freeze 3 --freeze ^transformer.h.0. --clip-grad-norm 0"; do
  read -r name ranks extra <<<"$cfg"
  args=("${common[@]}" $extra --ckpt-format sharded)
  train_run "mem-$name" "$ranks" "${args[@]}" --ckpt-dir "$work/ck-mem-$name"
  train_run "nvme-$name" "$ranks" "${args[@]}" --ckpt-dir "$work/ck-nvme-$name" "${offload[@]}"
  same_losses "$work/nvme-$name.jsonl" "$work/mem-$name.jsonl" 5
  same_checkpoint "$work/ck-mem-$name/step-5" "$work/ck-nvme-$name/step-5"
  # The optimizer's step count and state, as metadata.json records them (LoRA's root unit has an
  # empty trainable shard: nothing on disk, but stepped, as in memory).
  [ "$(jq -c .optimizer "$work/ck-mem-$name/step-5/metadata.json")" = \
    "$(jq -c .optimizer "$work/ck-nvme-$name/step-5/metadata.json")" ] ||
    fail "$name: metadata.json's optimizer differs: $(jq -c .optimizer "$work/ck-nvme-$name/step-5/metadata.json")"
  s="$work/nvme-$name.json"
  json_ok "$s" '.offload_file_bytes == .offload_file_bytes_predicted and
                .offload_read_bytes_per_step + .offload_written_bytes_per_step == .offload_io_bytes_per_step_predicted' \
    "$name: the disk figures are not the planner's: $(jq -c '[.offload_file_bytes, .offload_file_bytes_predicted, .offload_read_bytes_per_step, .offload_written_bytes_per_step, .offload_io_bytes_per_step_predicted]' "$s")"
  no_scratch_left
  echo "ok: $name on disk equals in memory bit for bit at W = $ranks"
done
# LoRA on disk resumed: 3 steps, then resumed to 5, equals the run in memory.
args=("${common[@]}" --model llama --lora-rank 8)
train_run lora-a 2 "${base[@]}" --model llama --lora-rank 8 --steps 3 --ckpt-dir "$work/ck-lora-resume" "${offload[@]}"
train_run lora-b 2 "${args[@]}" --ckpt-dir "$work/ck-lora-resume" --resume "${offload[@]}"
log_steps "$work/lora-b.jsonl" 4 5 > "$work/lora-b-4-5.jsonl"
log_steps "$work/mem-lora.jsonl" 4 5 > "$work/mem-lora-4-5.jsonl"
same_losses "$work/lora-b-4-5.jsonl" "$work/mem-lora-4-5.jsonl" 2
no_scratch_left
echo "ok: LoRA on disk resumes bit for bit"
"$plan" --model llama --preset tiny --world 2 --strategy full_shard --lora-rank 8 --offload nvme \
  --json > "$work/plan-lora.json" || fail "fsdp-plan --lora-rank 8 --offload nvme failed"
s="$work/nvme-lora.json"
json_is "$work/plan-lora.json" '.strategies[0].nvme.file_bytes' "$(jq .offload_file_bytes "$s")"
json_is "$work/plan-lora.json" '.strategies[0].nvme.read_bytes_per_step' "$(jq .offload_read_bytes_per_step "$s")"
json_is "$work/plan-lora.json" '.strategies[0].nvme.written_bytes_per_step' "$(jq .offload_written_bytes_per_step "$s")"
json_is "$work/plan-lora.json" '.strategies[0].nvme.resident_model_state_bytes' "$(jq '.model_state_bytes | max' "$s")"

# Resume: 3 steps offloaded, then resumed offloaded to 5, equals the
# uninterrupted run in memory; resharded to W = 1 and 4, equals the same
# resume in memory.
offload=(--offload-optimizer nvme --offload-params nvme --offload-dir "$scratch")
args=("${common[@]}" --strategy full_shard)
train_run resume-a 2 "${base[@]}" --strategy full_shard --steps 3 --ckpt-dir "$work/ck-resume" "${offload[@]}"
cp -r "$work/ck-resume/step-3" "$work/step-3"
train_run resume-b 2 "${args[@]}" --ckpt-dir "$work/ck-resume" --resume "${offload[@]}"
json_is "$work/resume-b.json" .first_step 3
log_steps "$work/resume-b.jsonl" 4 5 > "$work/resume-4-5.jsonl"
log_steps "$work/mem-full_shard-fp32.jsonl" 4 5 > "$work/mem-4-5.jsonl"
same_losses "$work/resume-4-5.jsonl" "$work/mem-4-5.jsonl" 2
same_checkpoint "$work/ck-mem-full_shard-fp32/step-5" "$work/ck-resume/step-5"
for ranks in 1 4; do
  for mode in mem nvme; do
    rm -rf "$work/ck-$ranks-$mode" && mkdir -p "$work/ck-$ranks-$mode" && cp -r "$work/step-3" "$work/ck-$ranks-$mode/"
    extra=(); [ "$mode" = nvme ] && extra=("${offload[@]}")
    train_run "reshard-$ranks-$mode" "$ranks" "${args[@]}" --ckpt-dir "$work/ck-$ranks-$mode" --resume "${extra[@]}"
  done
  same_losses "$work/reshard-$ranks-nvme.jsonl" "$work/reshard-$ranks-mem.jsonl" 2
  same_checkpoint "$work/ck-$ranks-mem/step-5" "$work/ck-$ranks-nvme/step-5"
  echo "ok: resharded to W = $ranks, offloaded equals in memory"
done
no_scratch_left

# Faults. Each run checkpoints at step 2 and breaks at step 3; the step-2
# checkpoint then resumes to the uninterrupted run's losses.
fault_then_resume() {  # NAME FAULT MESSAGE...
  local name="$1" fault="$2"; shift 2
  local out rc
  out=$(FSDP_TEST_OFFLOAD_FAULT="$fault" timeout 300 "$run" -n 2 -- "$train" "${args[@]}" --ckpt-dir "$work/ck-$name" \
        --ckpt-every 2 "${offload[@]}" 2>&1); rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out" >&2; fail "$name: expected the run to fail (exit $rc)"; }
  local want
  for want in "$@"; do grep -qF -- "$want" <<<"$out" || { echo "$out" >&2; fail "$name: the error lacks '$want'"; }; done
  [ -f "$work/ck-$name/step-2/metadata.json" ] && [ ! -e "$work/ck-$name/step-4" ] || fail "$name: not only step 2 saved"
  no_scratch_left  # unlinked when opened: nothing is left even by a killed rank
  train_run "$name-resumed" 2 "${args[@]}" --ckpt-dir "$work/ck-$name" --resume "${offload[@]}"
  json_is "$work/$name-resumed.json" .first_step 2
  log_steps "$work/$name-resumed.jsonl" 3 5 > "$work/$name-3-5.jsonl"
  log_steps "$work/mem-full_shard-fp32.jsonl" 3 5 > "$work/mem-3-5.jsonl"
  same_losses "$work/$name-3-5.jsonl" "$work/mem-3-5.jsonl" 3
  echo "ok: $name (exit $rc): the last checkpoint resumes exactly"
}
fault_then_resume corrupt 1:3:corrupt "fsdp-offload-rank1.bin" "offset 0" "does not match the checksum"
fault_then_resume truncate 0:3:truncate "fsdp-offload-rank0.bin" "offset"
fault_then_resume killed 1:3:kill
no_scratch_left

# A full disk: nvme-full-disk (a tmpfs, which needs root).

# Refusals.
expect_error "--offload-dir DIR" "$run" -n 1 -- "$train" --preset tiny --steps 1 --offload-optimizer nvme
expect_error "is not a folder" "$run" -n 1 -- "$train" --preset tiny --steps 1 --offload-optimizer nvme \
  --offload-dir "$work/none"
expect_error "must be none or nvme" "$run" -n 1 -- "$train" --preset tiny --steps 1 --offload-params disk \
  --offload-dir "$scratch"
expect_error "NvmeOffloadOptions::params needs a sharded strategy" "$run" -n 2 -- "$train" --preset tiny --steps 1 \
  --strategy zero1 --offload-params nvme --offload-dir "$scratch"
expect_error "needs optimizer_state(true) too" "$run" -n 2 -- "$train" --preset tiny --steps 1 --param-dtype bf16 \
  --offload-params nvme --offload-dir "$scratch"
expect_error "--adamw torch cannot be combined" "$run" -n 1 -- "$train" --preset tiny --steps 1 --adamw torch \
  --offload-optimizer nvme --offload-dir "$scratch"
expect_error "--offload-dir needs" "$run" -n 1 -- "$train" --preset tiny --steps 1 --offload-dir "$scratch"
no_scratch_left
