# What a user hit: a resume with nothing left to train, a checkpoint folder
# without --ckpt-every, an error seen by every rank, bf16 on a CPU without
# bf16 instructions, and --sample.

# --ckpt-dir alone saves after the last step.
train_run first 2 --preset tiny --steps 4 --ckpt-dir "$work/ck"
[ -f "$work/ck/step-4/metadata.json" ] || { ls -R "$work/ck"; fail "--ckpt-dir without --ckpt-every saved nothing"; }
jq -e '.step == 4' "$work/ck/step-4/metadata.json" >/dev/null || fail "the checkpoint is not at step 4"

# Resuming a checkpoint already at --steps: nothing to train, exit 0, no
# inf/NaN figures, no step appended to the log.
out=$("$run" -n 2 -- "$train" --preset tiny --steps 4 --ckpt-dir "$work/ck" --resume --log "$work/first.jsonl" 2>&1) ||
  { echo "$out"; fail "a resume with nothing left to train failed"; }
grep -qF "nothing left to train: the checkpoint is at step 4 and --steps is 4" <<<"$out" || { echo "$out"; fail "no 'nothing left to train'"; }
! grep -qE "inf tokens|nan|final loss" <<<"$out" || { echo "$out"; fail "the finished resume printed a summary of nothing"; }
require_steps "$work/first.jsonl" 4

# An error every rank sees (a corrupt checkpoint) is printed once, whole, and
# the job exits non-zero without MPI's banners.
corrupt_byte "$work/ck/step-4/shard-1.safetensors"
out=$("$run" -n 2 -- "$train" --preset tiny --steps 8 --ckpt-dir "$work/ck" --resume 2>&1) && { echo "$out"; fail "a corrupt checkpoint was loaded"; }
errors=$(grep -c "fsdp-train: error:" <<<"$out")
[ "$errors" -eq 1 ] || { echo "$out"; fail "the error was printed $errors times (expected once)"; }
grep -qE "^fsdp-train: error: '.*shard-1.safetensors' is corrupt: its bytes have checksum [0-9a-f]+, its header says [0-9a-f]+$" <<<"$out" ||
  { echo "$out"; fail "the error line is not whole"; }
! grep -qE "MPI_ABORT|Primary job|mpirun detected|ORTE_ERROR" <<<"$out" || { echo "$out"; fail "MPI's banner was printed"; }
echo "ok: one error line, no banner"

# A rank that dies of a signal is named in one line by fsdp-run.
out=$("$run" -n 2 -- bash -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -9 $$; sleep 5' 2>&1); status=$?
[ "$status" -eq 137 ] || { echo "$out"; fail "a killed rank gave status $status (expected 137)"; }
grep -qF "fsdp-run: a rank ended on signal 9 (KILL)" <<<"$out" || { echo "$out"; fail "fsdp-run did not name the signal"; }

# bf16 on a CPU without bf16 instructions (an AVX2-only machine's
# /proc/cpuinfo): both tools warn, naming the CPU and the slowdown; fp32 does not.
printf 'processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu avx avx2\n' > "$work/cpuinfo"
bf16_warning="warning: bf16 compute on this CPU (AMD EPYC 7B12; it has avx2, but neither AVX-512 BF16 nor AMX) runs in emulation: about 30x slower than fp32"
out=$(FSDP_CPUINFO="$work/cpuinfo" "$run" -n 1 -- "$train" --preset tiny --steps 1 --param-dtype bf16 2>&1) ||
  { echo "$out"; fail "a bf16 run failed"; }
grep -qF "fsdp-train: $bf16_warning" <<<"$out" || { echo "$out"; fail "fsdp-train did not warn of bf16 without bf16 instructions"; }
out=$(FSDP_CPUINFO="$work/cpuinfo" "$build/fsdp-plan" --preset tiny --param-dtype bf16 2>&1) || { echo "$out"; fail "fsdp-plan failed"; }
grep -qF "fsdp-plan: $bf16_warning" <<<"$out" || { echo "$out"; fail "fsdp-plan did not warn of bf16 without bf16 instructions"; }
out=$(FSDP_CPUINFO="$work/cpuinfo" "$run" -n 1 -- "$train" --preset tiny --steps 1 2>&1) || { echo "$out"; fail "an fp32 run failed"; }
! grep -qF "bf16 compute" <<<"$out" || { echo "$out"; fail "an fp32 run warned of bf16"; }
echo "ok: bf16 without bf16 instructions warned of, by both tools"

# --sample: greedy generation is deterministic and as long as asked.
for i in 1 2; do
  "$run" -n 2 -- "$train" --preset tiny --steps 20 --sample 40 --temperature 0 --prompt "The " > "$work/sample$i.out" 2>&1 ||
    { cat "$work/sample$i.out"; fail "--sample failed"; }
done
text=$(sed -n '/^== sample (40 tokens, greedy, prompt included) ==$/{n;p}' "$work/sample1.out")
[ -n "$text" ] || { cat "$work/sample1.out"; fail "no sample printed"; }
[ "${text:0:4}" = "The " ] || fail "the sample does not start with its prompt: '$text'"
cmp -s <(sed -n '/^== sample/,/^== summary/p' "$work/sample1.out") <(sed -n '/^== sample/,/^== summary/p' "$work/sample2.out") ||
  fail "greedy samples of two identical runs differ"
"$run" -n 2 -- "$train" --preset tiny --steps 2 --sample 30 --temperature 1.0 > "$work/sampled.out" 2>&1 || fail "sampling at temperature 1 failed"
grep -qF "== sample (30 tokens, temperature 1, prompt included) ==" "$work/sampled.out" || { cat "$work/sampled.out"; fail "no sampled text"; }
expect_error "--sample and --temperature must be >= 0" "$run" -n 2 -- "$train" --preset tiny --temperature -1
