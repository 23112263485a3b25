#!/usr/bin/env bash
# scripts/gpu_check.sh's own logic, without a GPU: its checks after the
# build (ctest's gpu label, parity, the benchmark against FSDP2, offload),
# sourced and run with FSDP_GPU_CHECK_DEVICE=cpu on the tiny shape, write the
# JSON lines a GPU machine's run is read by. The GPU machine is lent rarely
# and briefly: a mistake in this plumbing would cost a whole lease.
#   - the MFU's parameter count of every benchmark shape is the model's
#     (fsdp-plan's count for the same flags);
#   - ctest's gpu cases are counted (trainer_gpu left out: its runs are the
#     parity and offload checks'), and a skip is a failure there;
#   - parity's relative differences are computed and held to their
#     tolerances, and a run that trained otherwise (another learning rate
#     for W = 4) is caught;
#   - every benchmark and offload line carries its figures as numbers, and
#     the ratios to FSDP2 and to no offload where both sides have them (a
#     CPU has no device peak: those ratios are null here).
source "$(dirname "$0")/lib.sh" "$@"
python="${FSDP_PYTHON:-$here/../../.venv/bin/python}"
has_torch=0
"$python" -c "import torch" 2>/dev/null && has_torch=1
[ $has_torch = 1 ] || echo "note: no PyTorch at $python (scripts/setup.sh wheel makes it): the FSDP2 side is not run"
export FSDP_GPU_BUILD="$build" FSDP_GPU_CHECK_LOGS="$work/logs" FSDP_GPU_CHECK_DEVICE=cpu FSDP_GPU_BENCH_SHAPES=tiny \
  FSDP_GPU_BENCH_STEPS=3 FSDP_GPU_BENCH_BATCH=2 FSDP_GPU_PARITY_PRESET=tiny FSDP_GPU_PARITY_STEPS=4 \
  FSDP_PYTHON="$python" OUT="$work"
# shellcheck source=../../scripts/gpu_check.sh
source "$here/../../scripts/gpu_check.sh"
lines="$work/gpu_check.jsonl"
# line CHECK [ENGINE]: the last JSON line of that check (and engine).
line() { jq -c --arg c "$1" --arg e "${2:-}" 'select(.check == $c and ($e == "" or .engine == $e))' "$lines" | tail -1; }
expect() {  # CHECK ENGINE FILTER WHY
  local l; l=$(line "$1" "$2")
  [ -n "$l" ] || fail "no '$1' line${2:+ for $2} in $lines"
  jq -e "$3" <<<"$l" > /dev/null || fail "$4: $l"
  echo "ok: $1${2:+ ($2)}: $4"
}

for shape in large gpt2_124m tiny; do
  read -r n _ <<<"$(flops_per_token "$shape")"
  # shellcheck disable=SC2046
  planned=$("$build/fsdp-plan" $(shape_args "$shape") --json | jq .model.parameters)
  [ "$n" = "$planned" ] || fail "$shape: the MFU's parameter count is $n, the model's (fsdp-plan $(shape_args "$shape")) $planned"
  echo "ok: $shape has $n parameters, as fsdp-plan counts"
done

# Every command's time limit is cut to what is left before the deadline.
[ "$(deadline=100000 limit 150)" = 150 ] || fail "limit 150 with the deadline far: $(deadline=100000 limit 150)"
[ "$(deadline=0 limit 150)" = 1 ] || fail "limit 150 past the deadline: $(deadline=0 limit 150), expected 1"

check_tests
expect tests "" '.ok == false and .total >= 3 and .skipped == .total and .passed == 0 and (.not_passed | length) == .total' \
  "without a GPU every gpu case is counted as skipped, and that fails the check"
jq -e 'select(.check == "tests") | .not_passed | map(startswith("trainer_gpu ")) | any | not' "$lines" > /dev/null ||
  fail "trainer_gpu ran under gpu_check.sh (its runs are the parity and offload checks')"

check_parity
expect parity "" '.ok == true and (.vs_cuda_w1 | keys) == ["cpu_w1", "cuda_w2", "cuda_w4"]
                  and ([.vs_cuda_w1[] | .final_rel <= .tol and .max_step_rel <= .tol] | all)
                  and ([.final_loss[] | type == "number"] | all) and (.final_loss | length) == 4' \
  "W = 1, 2, 4 and the CPU agree within their tolerances"
# A W = 4 run that trains otherwise must fail the check, naming it.
eval "$(declare -f train | sed '1s/^train /real_train /')"
train() { if [ "$1" = parity_cuda_w4 ]; then real_train "$@" --lr 3e-3; else real_train "$@"; fi; }
check_parity
expect parity "" '.ok == false and .vs_cuda_w1.cuda_w4.final_rel > .vs_cuda_w1.cuda_w4.tol
                  and .vs_cuda_w1.cuda_w2.final_rel <= .vs_cuda_w1.cuda_w2.tol' \
  "a W = 4 run at another learning rate is caught, and W = 2 still agrees"
eval "$(declare -f real_train | sed '1s/^real_train /train /')"

check_bench
expect bench fsdp_cpp '.ok == true and .shape == "tiny" and .tokens_per_s > 0 and .step_s > 0 and .mfu > 0
                       and .n_params == '"$n"' and .peak_device_bytes == 0 and (.final_loss | type) == "number"' \
  "fsdp-cpp's figures are numbers (no device memory on a CPU)"
if [ $has_torch = 1 ]; then
  expect bench torch_fsdp2 '.tokens_per_s > 0 and .step_s > 0 and .mfu > 0 and (.final_loss | type) == "number"' \
    "FSDP2's figures are numbers"
  expect bench_vs_fsdp2 "" '.tokens_per_s_ratio > 0 and .peak_device_ratio == null and .ok == false' \
    "the tokens/s ratio is computed; without device peaks the memory goal cannot be met"
else
  expect bench torch_fsdp2 '.ok == false and (.error | type) == "string"' "FSDP2 could not run: the line says why"
fi

check_offload
expect offload_run "" '.ok == true and .engine == "fsdp_cpp_offload_cpu" and .tokens_per_s > 0' \
  "the --offload cpu run's figures are numbers"
expect offload "" '.tokens_per_s_ratio > 0 and .peak_device_ratio == null and .ok == false and .shape == "tiny"
                   and .batch == 4' \
  "offload against none: the time ratio is computed, the memory one needs a device"
# The logs come back after every check, so a run cut short still has them.
saved=$(tar -tzf "$work/gpu_logs.tar.gz") || fail "no readable $work/gpu_logs.tar.gz"
grep -qx './parity_cuda_w4.json' <<<"$saved" || fail "gpu_logs.tar.gz lacks the parity runs' summaries"
grep -qx './bench_fsdp_cpp_tiny_b4_offload.json' <<<"$saved" || fail "gpu_logs.tar.gz lacks the offload run"
pass
