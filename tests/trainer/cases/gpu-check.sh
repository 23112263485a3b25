# scripts/gpu_check.sh's own logic, without a GPU: sourced, its checks run
# with FSDP_GPU_CHECK_DEVICE=cpu on the tiny shape and write the JSON lines
# a GPU machine's run is read by. The GPU machine is lent rarely and briefly,
# and the script gets one try there: a mistake in this plumbing would cost
# the whole lease. Its main (every check, in order) runs here three times,
# with the prefix's unpacking and the configure and build steps stubbed
# (this suite's build is used, and the system's OpenMPI):
#   - with a working MPI: the env line comes first, is valid JSON and has
#     its keys; the checks come in their order (correctness first: parity_w1
#     before the benchmark, before offload, parity_w2_w4 and the tests); every
#     command runs under timeout -k, its limit at most what is left; python
#     sees the caller's LD_LIBRARY_PATH, not the prefix's; the one-rank runs
#     pass --backend auto; parity_w1's GPU run is not run again for W = 2, 4;
#   - with mpirun broken (a fake one, first on PATH, that fails): one-rank
#     runs still run, as MPI singletons, and W = 2, 4 and the tests are
#     skipped, saying why;
#   - with the singleton broken too: it stops after the prefix line, saying why.
# And, one check at a time:
#   - the MFU's parameter count of every benchmark shape is the model's
#     (fsdp-plan's count for the same flags);
#   - a command's limit is its cap or what is left, whichever is less, and a
#     check that does not fit is skipped with the reason;
#   - the NCCL smoke's gtest summary is read right (passed, skipped, failed,
#     absent, timed out: fake test_devices binaries);
#   - the log archive is written to a temporary file and renamed: a tar that
#     fails, or a kill mid-write, leaves the previous archive readable;
#   - ctest's gpu cases are counted (trainer_gpu left out: its runs are the
#     parity and offload checks'), and a skip is a failure there;
#   - parity's relative differences are computed and held to their
#     tolerances, and a run that trained otherwise (another learning rate
#     for W = 4) is caught;
#   - issue 42's checks (zeropp, ckpt_async, nvme_offload, sdpa, lora) come
#     after the first benchmark, as the dry run's order says, and hold their
#     verdicts here (sdpa: "ok": null, failing nothing, on a LibTorch
#     without fused attention); the mpirun-broken run stubs them (main's ran them);
#   - every benchmark and offload line carries its figures as numbers, and
#     the ratios to FSDP2 and to no offload where both sides have them (a
#     CPU has no device peak: those ratios are null here).
# Its FSDP2 side and torch NCCL check need PyTorch (scripts/test.sh installs
# it first, scripts/python_refs.sh): without it the case is skipped, not
# passed in part.
real_python="${FSDP_PYTHON:-$here/../../.venv/bin/python}"
"$real_python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null ||
  skip "no PyTorch at $real_python (scripts/python_refs.sh installs it): the FSDP2 side and the torch NCCL check cannot run"
# Python records the LD_LIBRARY_PATH it was started with.
cat > "$work/python" <<EOF
#!/usr/bin/env bash
echo "\${LD_LIBRARY_PATH-<unset>}" >> "$work/python-ld"
exec "$real_python" "\$@"
EOF
chmod +x "$work/python"
# The caller's LD_LIBRARY_PATH, as on the GPU image (its driver's folder is
# named there): a folder of this case's ahead of what was set. And variables
# the env line must show.
mkdir -p "$work/caller-lib"
caller_ld="$work/caller-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="$caller_ld" NVIDIA_TF32_OVERRIDE=0 TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=0 NCCL_GPU_CHECK_CASE=1 \
  CUBLAS_WORKSPACE_CONFIG=:4096:8
export FSDP_GPU_BUILD="$build" FSDP_GPU_CHECK_LOGS="$work/logs" FSDP_GPU_CHECK_DEVICE=cpu FSDP_GPU_BENCH_SHAPES=tiny \
  FSDP_GPU_BENCH_STEPS=3 FSDP_GPU_BENCH_BATCH=2 FSDP_GPU_PARITY_PRESET=tiny FSDP_GPU_PARITY_STEPS=4 \
  FSDP_PYTHON="$work/python" OUT="$work"
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

# The stubs of main's runs: the prefix is the system's OpenMPI (unpacking
# is only prepending the prefix's libraries to LD_LIBRARY_PATH, as the real
# one does), this suite's build is configured and built already. Every
# command under timeout is recorded: the script's seconds, its deadline, the
# arguments.
unpack_prefix() { return 0; }
prefix_env() { export LD_LIBRARY_PATH="$work/prefix-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
check_configure() { emit configure true note '"stubbed: the suite'"'"'s build"'; }
check_build() { emit build true target "$(str "$*")" note '"stubbed: the suite'"'"'s build"'; }
timeout() { local a="$*"; echo "$(elapsed) $deadline ${a//$'\n'/ }" >> "$work/timeouts"; command timeout "$@"; }
# run_main NAME: main in a subshell, into $work/NAME/ (its lines, logs and
# archive) with its own start; lines="$work/NAME/gpu_check.jsonl" after.
run_main() {
  local name="$1"; mkdir -p "$work/$name/logs"; : > "$work/timeouts"; : > "$work/python-ld"
  ( OUT="$work/$name"; jsonl="$OUT/gpu_check.jsonl"; logs="$OUT/logs"; : > "$jsonl"
    start=$EPOCHREALTIME; failed=(); launch=mpirun; stopped=""; main ) > "$work/$name/stdout" 2>&1
  local rc=$?
  lines="$work/$name/gpu_check.jsonl"
  jq -ce . "$lines" > /dev/null || { cat "$work/$name/stdout" >&2; fail "$name: a line of $lines is not JSON"; }
  echo "ok: main ($name) wrote $(wc -l < "$lines") JSON lines in $(jq -s '.[-1].elapsed_s' "$lines") s"
  return $rc
}
checks() { jq -r .check "$lines" | uniq | paste -sd ' '; }  # the checks' names in order, one per run of lines

# ---- main, MPI working.
run_main main && fail "main returned 0 on a CPU (its GPU checks cannot pass here)"
cp "$work/timeouts" "$work/main/timeouts"
[ "$(head -1 "$lines" | jq -r .check)" = env ] || fail "the first line is not the env line: $(head -1 "$lines")"
expect env "" '.ok == true and (.variables | .NVIDIA_TF32_OVERRIDE == "0" and .TORCH_ALLOW_TF32_CUBLAS_OVERRIDE == "0"
               and .NCCL_GPU_CHECK_CASE == "1" and .CUBLAS_WORKSPACE_CONFIG == ":4096:8" and (has("HOME") | not))
               and .ld_library_path == "'"$caller_ld"'" and has("libcuda") and (.hostname | length) > 0
               and .nproc == '"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"' and .settings.device == "cpu"' \
  "the first line: the numerics' and NCCL's variables, the caller's LD_LIBRARY_PATH, libcuda, host, cores"
want="env prefix gpu nccl_torch configure build nccl parity_w1 bench bench_vs_fsdp2 zeropp ckpt_async nvme_offload sdpa lora offload_run offload parity_w2_w4 tests done"
[ "$(checks)" = "$want" ] || fail "the checks ran in the order '$(checks)', expected '$want'"
[ "$(planned_order)" = "$want" ] || fail "the dry run's order '$(planned_order)' is not main's '$want'"
[ "$(bench_shapes="large gpt2_124m" planned_order)" = "${want/lora/lora bench bench_vs_fsdp2}" ] ||
  fail "with two shapes the dry run's order is '$(bench_shapes="large gpt2_124m" planned_order)'"
echo "ok: the order (main's and the dry run's): $want"
expect prefix "" '.ok == true and .launch == "mpirun" and .mpirun_rc == 0 and .singleton_rc == 0' "MPI works both ways"
expect gpu "" '.ok == false and (.skipped | test("FSDP_GPU_CHECK_DEVICE=cpu"))' "no GPU is looked for on a CPU run"
expect nccl_torch "" '.ok == true and .world_size == 1 and .result.backend == "gloo" and .result.sum == 3 and .result.stage == "done"' \
  "one all-reduce through torch.distributed at world size 1 (gloo on a CPU)"
if "$build/tests/test_devices" --gtest_list_tests 2>/dev/null | grep '^NcclSmoke\.' > /dev/null; then smoke=skipped; else smoke=absent; fi
expect nccl "" '.ok == false and .status == "'$smoke'" and .w1_runs_use_nccl == false and (.note | test("no NCCL"))' \
  "the library's NCCL smoke without a GPU: $smoke, and the line says one-rank runs use no NCCL"
expect parity_w1 "" '.ok == true and .launch == "mpirun" and (.vs_cuda_w1 | keys) == ["cpu_w1"]
                     and (.vs_cuda_w1.cpu_w1 | .final_rel <= .tol and .max_step_rel <= .tol and .tol == 1e-4)
                     and (.final_loss | keys) == ["cpu_w1", "cuda_w1"] and ([.final_loss[] | type == "number"] | all)' \
  "one rank: the GPU run (here on the CPU) against the CPU's"
expect parity_w2_w4 "" '.ok == true and (.vs_cuda_w1 | keys) == ["cuda_w2", "cuda_w4"] and (.reference.cuda_w1 | type) == "number"
                        and ([.vs_cuda_w1[] | .final_rel <= .tol and .max_step_rel <= .tol and .tol == 1e-5] | all)' \
  "W = 2, 4 against parity_w1's one-rank run, within their tolerances"
# Every command ran under timeout -k, with a limit of at most what was left
# (the deadline less the kill's 10 s, at the second it started).
awk '{ if ($3 != "-k" || $4 !~ /^[0-9]+$/ || $5 !~ /^[0-9]+$/) { print "no -k and limit: " $0; bad = 1 }
       else if ($5 > $2 - 10 - $1 + 1 && $5 > 1) { print "limit past the deadline: " $0; bad = 1 } }
     END { exit bad }' "$work/timeouts" || fail "a command's time limit is wrong (the lines above)"
for cmd in mpicxx mpirun mpi_hello ompi_info "$work/python -c" test_devices "$build/fsdp-run -n 1" "$build/fsdp-run -n 4" bench/peer.py ctest; do
  grep -qF -- "$cmd" "$work/timeouts" || fail "no command '$cmd' ran under timeout: $(cut -c1-200 "$work/timeouts")"
done
echo "ok: $(wc -l < "$work/timeouts") commands ran under timeout -k, each limit within what was left"
[ "$(grep -c -- '--summary [^ ]*/parity_cuda_w1.json' "$work/timeouts")" = 1 ] || fail "parity_cuda_w1 ran other than once"
grep -- '--summary [^ ]*/parity_cuda_w1.json' "$work/timeouts" | grep -F -- '--backend auto' > /dev/null || fail "the one-rank GPU parity run lacks --backend auto"
grep -- '--summary [^ ]*/bench_fsdp_cpp_tiny.json' "$work/timeouts" | grep -F -- '--backend auto' > /dev/null || fail "the benchmark run lacks --backend auto"
echo "ok: the one-rank GPU runs pass --backend auto; parity_cuda_w1 ran once"
# Python saw the caller's LD_LIBRARY_PATH, not the prefix's.
[ "$(grep -c . "$work/python-ld")" -ge 2 ] || fail "python ran fewer than twice (the env line, the torch NCCL check): $(cat "$work/python-ld")"
[ "$(sort -u "$work/python-ld")" = "$caller_ld" ] || fail "python ran with LD_LIBRARY_PATH '$(sort -u "$work/python-ld" | paste -sd '|')', expected the caller's '$caller_ld'"
echo "ok: python ran $(wc -l < "$work/python-ld") times with the caller's LD_LIBRARY_PATH"
expect "done" "" '.ok == false and .stopped == null and (.failed | any(. == "gpu")) and (.failed | any(. == "parity_w1") | not)' \
  "the done line lists the failed checks"
saved=$(tar -tzf "$work/main/gpu_logs.tar.gz") || fail "no readable $work/main/gpu_logs.tar.gz"
grep -qx './parity_cuda_w4.json' <<<"$saved" || fail "gpu_logs.tar.gz lacks the parity runs' summaries"
grep -qx './nccl_smoke.log' <<<"$saved" || fail "gpu_logs.tar.gz lacks the NCCL smoke's log"
[ ! -e "$work/main/gpu_logs.partial.tar.gz" ] || fail "the archive's temporary file was left in \$OUT"

# The checks' own figures, from main's lines.
expect tests "" '.ok == false and .total >= 3 and .skipped == .total and .passed == 0 and (.not_passed | length) == .total' \
  "without a GPU every gpu case is counted as skipped, and that fails the check"
line tests | jq -e '.not_passed | map(startswith("trainer_gpu ")) | any | not' > /dev/null ||
  fail "trainer_gpu ran under gpu_check.sh (its runs are the parity and offload checks')"
read -r n _ <<<"$(flops_per_token tiny)"
expect bench fsdp_cpp '.ok == true and .shape == "tiny" and .tokens_per_s > 0 and .step_s > 0 and .mfu > 0
                       and .n_params == '"$n"' and .peak_device_bytes == 0 and (.final_loss | type) == "number"' \
  "fsdp-cpp's figures are numbers (no device memory on a CPU)"
expect bench torch_fsdp2 '.tokens_per_s > 0 and .step_s > 0 and .mfu > 0 and (.final_loss | type) == "number"' \
  "FSDP2's figures are numbers"
expect bench_vs_fsdp2 "" '.tokens_per_s_ratio > 0 and .peak_device_ratio == null and .ok == false' \
  "the tokens/s ratio is computed; without device peaks the memory goal cannot be met"
expect offload_run "" '.ok == true and .engine == "fsdp_cpp_offload_cpu" and .tokens_per_s > 0' \
  "the --offload cpu run's figures are numbers"
expect offload "" '.tokens_per_s_ratio > 0 and .peak_device_ratio == null and .ok == false and .shape == "tiny"
                   and .batch == 4' \
  "offload against none: the time ratio is computed, the memory one needs a device"

# Issue 42's checks, at one rank on the parity preset.
expect zeropp "" '.ok == true and .gather_quantization == "int8" and .gather_bytes_ratio < 0.3
                  and .vs_cuda_w1.within and .vs_cuda_w1.tol == 2e-2' \
  "the int8 gather ran at one rank (a quarter of the bytes counted), its losses within 2e-2 of parity's run"
expect ckpt_async "" '.ok == true and .checkpoint.async and .checkpoint.saves == 2 and .resumed.final_rel <= 1e-5
                      and .vs_cuda_w1.within' \
  "async saves at half way and the end; a run resumed from the half-way one ends where the first did"
expect nvme_offload "" '.ok == true and .vs_in_memory.within and .bit_identical and .read_bytes_per_step > 0' \
  "NVMe offload stepping in backward trains as in memory (bit for bit on a CPU)"
libtorch=$(jq -r '.libtorch // ""' "$work/main/logs/w1_attention_written.json" 2>/dev/null)  # main's run's
if [ "${libtorch%%.*}" != 1 ]; then
  expect sdpa "" '.ok == true and .vs_written.within' "SDPA's losses within 1e-4 of the written-out attention's"
else
  expect sdpa "" '.ok == null and (.pending | test("LibTorch 1[.].* has no scaled_dot_product_attention"))' \
    "on LibTorch $libtorch, which has no fused attention, the line says so, and fails nothing"
  line "done" | jq -e '.failed | any(. == "sdpa") | not' > /dev/null || fail "a pending sdpa line failed the script"
fi
expect lora "" '.ok == true and .final_loss < .first_loss and .weights.base_tensors > 0 and (.weights.base_changed | length) == 0
                and .weights.adapters_changed > 0' \
  "LoRA: the loss falls, the base weights are unchanged byte for byte, the adapters trained"

# A W = 4 run that trains otherwise must fail parity_w2_w4, naming it
# (main's logs: its cuda_w1 and cuda_w2 runs are reused, not run again).
lines="$work/gpu_check.jsonl" logs="$work/main/logs"
eval "$(declare -f train | sed '1s/^train /real_train /')"
train() { case "$1" in parity_cuda_w2) return 0 ;; parity_cuda_w4) real_train "$@" --lr 3e-3 ;; *) fail "train $1 was not expected" ;; esac; }
check_parity_w2_w4 > /dev/null
expect parity_w2_w4 "" '.ok == false and .vs_cuda_w1.cuda_w4.final_rel > .vs_cuda_w1.cuda_w4.tol
                        and .vs_cuda_w1.cuda_w2.final_rel <= .vs_cuda_w1.cuda_w2.tol' \
  "a W = 4 run at another learning rate is caught, and W = 2 still agrees"
eval "$(declare -f real_train | sed '1s/^real_train /train /')"
logs="$work/logs"

for shape in large gpt2_124m tiny; do
  read -r n _ <<<"$(flops_per_token "$shape")"
  # shellcheck disable=SC2046
  planned=$("$build/fsdp-plan" $(shape_args "$shape") --json | jq .model.parameters)
  [ "$n" = "$planned" ] || fail "$shape: the MFU's parameter count is $n, the model's (fsdp-plan $(shape_args "$shape")) $planned"
  echo "ok: $shape has $n parameters, as fsdp-plan counts"
done

# ---- main, mpirun broken (it fails at once), the singleton working.
mkdir -p "$work/broken-mpi"
printf '#!/bin/sh\necho "$*" >> "%s/mpirun-calls"\necho "mpirun: broken on purpose" >&2\nexit 1\n' "$work" > "$work/broken-mpi/mpirun"
chmod +x "$work/broken-mpi/mpirun"
real_bench_peer=$(declare -f bench_peer)
bench_peer() { return 1; }  # main's run had FSDP2's; not needed again
check_nccl_torch() { emit nccl_torch false skipped '"main'"'"'s run had it"'; }
real_issue42_checks=$(declare -f check_zeropp check_ckpt_async check_nvme_offload check_sdpa check_lora)
for c in zeropp ckpt_async nvme_offload sdpa lora; do eval "check_$c() { skip $c \"main's run had it\"; }"; done
PATH="$work/broken-mpi:$PATH" run_main fallback && fail "main returned 0 with mpirun broken"
eval "$real_issue42_checks"
[ "$(checks)" = "$want" ] || fail "with mpirun broken the checks ran in the order '$(checks)', expected '$want'"
expect prefix "" '.ok == false and .launch == "singleton" and .mpirun_rc != 0 and .singleton_rc == 0 and (.verdict | test("singleton"))' \
  "mpirun broken: the prefix check fails, and one-rank runs go on as singletons"
expect parity_w1 "" '.ok == true and .launch == "singleton" and ([.final_loss[] | type == "number"] | all)' \
  "parity_w1's runs ran as singletons"
expect bench fsdp_cpp '.ok == true and .tokens_per_s > 0' "the benchmark's run ran as a singleton"
expect offload_run fsdp_cpp_offload_cpu '.ok == true' "offload's runs ran as singletons"
expect parity_w2_w4 "" '.ok == false and (.skipped | test("mpirun"))' "W = 2, 4 are skipped, saying why"
expect tests "" '.ok == false and (.skipped | test("mpirun"))' "the gpu tests (through fsdp-run) are skipped, saying why"
expect "done" "" '.stopped == null and .launch == "singleton"' "the checks went on"
[ "$(wc -l < "$work/mpirun-calls")" = 1 ] || fail "mpirun was called other than once (the prefix's hello): $(cat "$work/mpirun-calls")"
! grep -qF "$build/fsdp-run" "$work/timeouts" || fail "fsdp-run was started with mpirun broken: $(grep -F fsdp-run "$work/timeouts")"
grep -- '--summary [^ ]*/parity_cuda_w1.json' "$work/timeouts" | grep -F "FSDP_THREADS_PER_RANK=" > /dev/null ||
  fail "the singleton run did not get fsdp-run's thread settings"
echo "ok: with mpirun broken, mpirun was called only by the prefix check"
# check_prefix's status is its own verdict (not its line's writing).
( PATH="$work/broken-mpi:$PATH" check_prefix > /dev/null ) && fail "check_prefix returned 0 with mpirun broken"
echo "ok: check_prefix fails where mpirun does"

# ---- main, the singleton broken too (no PML to load): it stops after the
# prefix line, with nothing configured.
: > "$work/mpirun-calls"
OMPI_MCA_pml=no_such_pml PATH="$work/broken-mpi:$PATH" run_main stopped && fail "main returned 0 with MPI broken"
[ "$(checks)" = "env prefix done" ] || fail "with MPI broken the checks were '$(checks)', expected 'env prefix done'"
expect prefix "" '.ok == false and .launch == "none" and .singleton_rc != 0 and (.verdict | test("singleton failed"))' \
  "the singleton broken: the prefix line says nothing can run"
expect "done" "" '.ok == false and (.stopped | test("MPI"))' "the done line says why it stopped"
eval "$real_bench_peer"

# ---- one check at a time, in this shell ($work/logs, $work/gpu_check.jsonl).
lines="$work/gpu_check.jsonl"
# A command's limit is its cap, or what is left before the deadline (less
# the kill's 10 s) where that is less.
[ "$(deadline=100000 limit 150)" = 150 ] || fail "limit 150 with the deadline far: $(deadline=100000 limit 150)"
[ "$(deadline=0 limit 150)" = 1 ] || fail "limit 150 past the deadline: $(deadline=0 limit 150), expected 1"
: > "$work/timeouts"
deadline=$(( $(elapsed) + 50 )) train limit_run 1 --preset tiny --steps 1 || fail "a one-step run failed: $(tail -5 "$work/logs/limit_run.log")"
read -r at dl _ _ lim _ < "$work/timeouts"
[ "$lim" -le 40 ] && [ "$lim" -ge $(( dl - 10 - at - 1 )) ] || fail "a run with 40 s left had the limit $lim (its cap is 150): $(cat "$work/timeouts")"
echo "ok: a run's limit is what is left ($lim s), not its cap"
# A check that does not fit does not start; its line says why.
ran=0
deadline=$(( $(elapsed) + 40 )) attempt offload 60 eval 'ran=1' > /dev/null
[ $ran = 0 ] || fail "a check needing 60 s started with 30 s left"
expect offload "" '.ok == false and (.skipped | test("needs at least 60 s"))' "a check that does not fit is skipped, saying why"
budget=0 attempt tests 1 eval 'ran=1' > /dev/null
[ $ran = 0 ] || fail "a check started past the budget"
expect tests "" '.ok == false and (.skipped | test("over the time budget"))' "past the budget no check starts"

# The NCCL smoke's gtest summary, from fake test_devices binaries.
mkdir -p "$work/fake/tests"
fake_smoke() {  # GTEST_SUMMARY_LINES [EXIT]: a test_devices that prints them
  printf '#!/bin/sh\nprintf "%%s\\n" %s\nexit %s\n' "$1" "${2:-0}" > "$work/fake/tests/test_devices"
  chmod +x "$work/fake/tests/test_devices"
}
smoke_is() {  # STATUS FILTER
  build="$work/fake" check_nccl > /dev/null
  expect nccl "" ".status == \"$1\" and ($2)" "the smoke's summary read as $1"
}
fake_smoke "'[==========] 1 test from 1 test suite ran. (5 ms total)' '[  PASSED  ] 1 test.'"
smoke_is passed '.ok == true and .passed == 1'
fake_smoke "'[==========] 2 tests from 1 test suite ran. (0 ms total)' '[  PASSED  ] 0 tests.' '[  SKIPPED ] 2 tests, listed below:' '[  SKIPPED ] NcclSmoke.A'"
smoke_is skipped '.ok == false and .skipped == 2'
fake_smoke "'[==========] 1 test from 1 test suite ran. (0 ms total)' '[  PASSED  ] 0 tests.' '[  FAILED  ] 1 test, listed below:' '[  FAILED  ] NcclSmoke.A'" 1
smoke_is failed '.ok == false and .failed == 1'
fake_smoke "'[==========] 0 tests from 0 test suites ran. (0 ms total)' '[  PASSED  ] 0 tests.'"
smoke_is absent '.ok == false'
printf '#!/bin/sh\nexec sleep 30\n' > "$work/fake/tests/test_devices"
deadline=$(( $(elapsed) + 12 )) smoke_is timed_out '.ok == false and .rc == 124 and .limit_s <= 2'

# The driver's libcuda: found in the caller's LD_LIBRARY_PATH first.
mkdir -p "$work/driver"; : > "$work/driver/libcuda.so.1"
[ "$(caller_ld_library_path="/nonexistent:$work/driver" libcuda)" = "$work/driver/libcuda.so.1 LD_LIBRARY_PATH" ] ||
  fail "libcuda in LD_LIBRARY_PATH not found: '$(caller_ld_library_path="/nonexistent:$work/driver" libcuda)'"
echo "ok: libcuda is looked for in the caller's LD_LIBRARY_PATH"

# The offload check's file names are its own shape's, whatever the caller's
# shell holds in a variable named shape.
shape=gpt2_124m check_offload > /dev/null
expect offload "" '.shape == "tiny" and .tokens_per_s_ratio > 0' "the offload pair is found under its own shape's names"

# The archive: written to a temporary file and renamed. A tar that fails, or
# a kill in the middle of writing, leaves the last whole archive.
save_logs
cp "$work/gpu_logs.tar.gz" "$work/before.tar.gz"
echo more > "$work/logs/more.log"
tar() {  # writes half an archive to its -f file, then fails
  local f="" a; for a in "$@"; do [ "$f" != next ] || f="$a"; case "$a" in -*f) f=next ;; esac; done
  echo "$f" >> "$work/tar-targets"; head -c 100 "$work/before.tar.gz" > "$f"; return 1
}
save_logs
cmp -s "$work/gpu_logs.tar.gz" "$work/before.tar.gz" || fail "a failing tar changed gpu_logs.tar.gz"
tar() { local f="" a; for a in "$@"; do [ "$f" != next ] || f="$a"; case "$a" in -*f) f=next ;; esac; done
        head -c 100 "$work/before.tar.gz" > "$f"; kill -KILL "$BASHPID"; }
{ ( save_logs ); } 2>/dev/null
cmp -s "$work/gpu_logs.tar.gz" "$work/before.tar.gz" || fail "a kill mid-write changed gpu_logs.tar.gz"
unset -f tar
[ "$(sort -u "$work/tar-targets")" = "$work/gpu_logs.partial.tar.gz" ] || fail "tar wrote to $(cat "$work/tar-targets"), expected the temporary file"
tar -tzf "$work/gpu_logs.tar.gz" > /dev/null || fail "gpu_logs.tar.gz is not readable after a failed write"
save_logs
tar -tzf "$work/gpu_logs.tar.gz" | grep -x './more.log' > /dev/null || fail "a whole write did not replace gpu_logs.tar.gz"
[ ! -e "$work/gpu_logs.partial.tar.gz" ] || fail "the temporary file was left after a whole write"
echo "ok: the archive is written to a temporary file and renamed; a failed or killed write leaves the last one"
