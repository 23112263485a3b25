#!/usr/bin/env bash
# On a machine with a GPU (the device tool's H200: PyTorch as python3, cmake,
# ninja, nvcc, NCCL; no MPI, no network): builds fsdp-cpp and runs its GPU
# checks in at most 8 minutes, one JSON line per check on stdout and in
# $OUT/gpu_check.jsonl ($OUT unset: build-gpu/gpu_check.jsonl); each line is
# {"check": NAME, "ok": true|false, figures..., "elapsed_s": S}. A failing
# check does not stop the ones after it (a broken MPI does: below). Run from
# anywhere, as one command:
#
#   bash scripts/gpu_carry.sh                 # here, once: fills .gpu-carry/
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=560)
#   bash scripts/gpu_check.sh --dry-run       # no GPU: env, prefix, configure, stop
#
# Checks, in this order: correctness first, then one benchmark shape, then
# the rest, so that a slow build or a slow run costs the least important ones.
#   env          always the first line: the variables that change numerics
#                or NCCL (TF32 overrides, NCCL_*, CUDA_VISIBLE_DEVICES,
#                CUDA_LAUNCH_BLOCKING, CUBLAS_WORKSPACE_CONFIG, ...), the
#                caller's LD_LIBRARY_PATH, the driver's libcuda, host, cores
#   prefix       OpenMPI unpacked from .gpu-carry/ works: an MPI hello as
#                mpirun -n 2 and as a singleton. mpirun broken, the singleton
#                working: one-rank runs go on as singletons (fsdp-train
#                started without fsdp-run), parity_w2_w4 and tests are
#                skipped. The singleton broken too: the script stops here
#                (fsdp-train calls MPI_Init, nothing could run)
#   gpu          nvidia-smi, and python's torch sees the GPU
#   nccl_torch   one all-reduce through PyTorch's NCCL at world size 1
#                (a file:// store), before the build: does NCCL work here
#   configure, build (only what the checks run)
#   nccl         the library's own NCCL smoke (tests/test_devices
#                --gtest_filter=NcclSmoke.*, an MPI singleton): passed,
#                skipped, failed, crashed, timed_out or absent, with its log
#   parity_w1    fp32 losses at one rank, GPU against CPU; one-rank GPU
#                runs (--backend auto) do their collectives as device
#                copies, without NCCL
#   bench, bench_vs_fsdp2 on the first shape (bf16, fsdp-cpp full_shard
#                against PyTorch FSDP2 fully_shard at W=1: tokens/s, peak
#                device memory, MFU)
#   zeropp, ckpt_async, nvme_offload, sdpa, lora: the device code written
#                since issue 25's review (issue 42), each at W = 1 on
#                parity's preset in fp32, against a run without it (parity_w1's
#                GPU run where the flags are the same): ZeRO++'s int8 gather
#                through the group of one; async checkpoint staging (a run
#                resumed from its mid checkpoint ends where it did); NVMe
#                offload stepping each unit in backward; SDPA against the
#                written-out attention ("ok": null, not a failure, while
#                fsdp-train has no --attention); LoRA (loss falls, base
#                weights unchanged)
#   bench, bench_vs_fsdp2 on the other shapes
#   offload_run x2, offload  (--offload cpu against none)
#   parity_w2_w4 W = 2, 4 ranks on the one GPU against parity_w1's GPU run
#   tests        ctest -L gpu, but trainer_gpu, whose runs parity and
#                offload repeat
#   done         the failed checks, and why the script stopped if it did
# The dry run's done line lists this order ("order"), as main runs it.
# A check starts only before the budget and if what is left before the
# deadline covers its least need; else its line says it was skipped and why.
# Every command has a hard limit (timeout -k: the trainer ends at a step
# boundary after SIGTERM), its cap or what is left before the deadline if
# less. NCCL's own messages (NCCL_DEBUG=WARN) go to NCCL_DEBUG_FILE in the
# logs; the logs and summaries go to $OUT/gpu_logs.tar.gz, rewritten (a
# temporary file, renamed) after every check. Python (the torch probes,
# bench/peer.py) runs with the caller's LD_LIBRARY_PATH (the GPU image finds
# its driver through it), not the prefix's, whose libraries could shadow
# torch's own.
#
# Settings (environment): FSDP_LIBTORCH (default: python3's torch folder),
# FSDP_PYTHON (python3, or .venv/bin/python where python3 has no torch), FSDP_GPU_BUILD (build-gpu), FSDP_GPU_PREFIX
# (/tmp/gpu-prefix), FSDP_GPU_CHECK_NO_GPU=1 (as --dry-run),
# FSDP_GPU_CHECK_TARGET (--dry-run: also build this one target),
# FSDP_GPU_CHECK_JOBS (build jobs, default all cores), FSDP_GPU_CMAKE_ARGS
# (more cmake arguments), FSDP_GPU_BENCH_STEPS (15), FSDP_GPU_BENCH_BATCH (16),
# FSDP_GPU_CHECK_BUDGET (seconds after which no further check starts: 400),
# FSDP_GPU_CHECK_DEADLINE (seconds by which every command has ended, its
# time limit cut to what is left, less the 10 s the kill after SIGTERM may
# take: 470, inside the 8 minutes),
# FSDP_GPU_OFFLOAD_BATCH (the offload pair's sequences: 4; the bench's
# batch is mostly activations, which offload does not move), FSDP_GPU_BENCH_SHAPES (large
# gpt2_124m; the first is benchmarked right after parity_w1), FSDP_GPU_PARITY_PRESET (small), FSDP_GPU_PARITY_STEPS (20),
# FSDP_GPU_CHECK_LOGS ($FSDP_GPU_BUILD/gpu-logs), FSDP_GPU_CHECK_DEVICE
# (cuda; cpu runs the checks' own logic without a GPU, with the tiny shape,
# NCCL's torch check on gloo: tests/trainer/cases/gpu-check.sh does, sourcing this
# script), NCCL_DEBUG (WARN for the two NCCL checks).
set -uo pipefail
# The caller's LD_LIBRARY_PATH, before prefix_env prepends the prefix's
# libraries: python runs with it (with_caller_libs), and the env line shows it.
caller_ld_library_path="${LD_LIBRARY_PATH-}"
caller_ld_library_path_set=0; [ -z "${LD_LIBRARY_PATH+set}" ] || caller_ld_library_path_set=1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

dry=0
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # sourced, the arguments are the caller's
  case "${1:-}" in
    --dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: scripts/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
  esac
fi
[ -z "${FSDP_GPU_CHECK_NO_GPU:-}" ] || dry=1
build="${FSDP_GPU_BUILD:-build-gpu}"
prefix="${FSDP_GPU_PREFIX:-/tmp/gpu-prefix}"
python="${FSDP_PYTHON:-python3}"
# Here (no GPU), python3 has no torch: scripts/setup.sh wheel's .venv does.
# (The GPU machine has no .venv: the probe costs it nothing.)
if [ -z "${FSDP_PYTHON:-}" ] && [ -x .venv/bin/python ] && ! timeout -k 5 60 python3 -c 'import torch' 2>/dev/null; then
  python=.venv/bin/python
fi
jobs="${FSDP_GPU_CHECK_JOBS:-$(nproc)}"
budget="${FSDP_GPU_CHECK_BUDGET:-400}"
deadline="${FSDP_GPU_CHECK_DEADLINE:-470}"
kill_after=10  # timeout -k: SIGKILL this long after SIGTERM
offload_batch="${FSDP_GPU_OFFLOAD_BATCH:-4}"
# A stuck collective ends its run with the watchdog's message naming it,
# well inside the run's own time limit (the default is 600 s).
export FSDP_COLLECTIVE_TIMEOUT="${FSDP_COLLECTIVE_TIMEOUT:-60}"
bench_steps="${FSDP_GPU_BENCH_STEPS:-15}"
bench_batch="${FSDP_GPU_BENCH_BATCH:-16}"
bench_shapes="${FSDP_GPU_BENCH_SHAPES:-large gpt2_124m}"
parity_preset="${FSDP_GPU_PARITY_PRESET:-small}"
parity_steps="${FSDP_GPU_PARITY_STEPS:-20}"
device="${FSDP_GPU_CHECK_DEVICE:-cuda}"
nccl_debug="${NCCL_DEBUG:-WARN}"
peak_flops=989e12  # H200 SXM dense bf16, the vendor's figure (KINDS.md measured ~790e12 on random data)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc honours OMP_NUM_THREADS
logs="${FSDP_GPU_CHECK_LOGS:-$build/gpu-logs}"
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"
jsonl="${OUT:+$OUT/gpu_check.jsonl}"
jsonl="${jsonl:-$build/gpu_check.jsonl}"
: > "$jsonl"
start=$EPOCHREALTIME
failed=()
# How ranks start, set by check_prefix: mpirun (fsdp-run), singleton (mpirun
# broken: one-rank runs only, fsdp-train started directly), or none.
launch=mpirun
stopped=""  # why the script stopped early, for the done line

# elapsed: whole seconds since the script started.
elapsed() { local now=$EPOCHREALTIME; echo $(( ${now%.*} - ${start%.*} )); }
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# emit CHECK OK [KEY JSON]...: one line {"check": CHECK, "ok": OK, KEY: JSON...}.
# Before jq is unpacked (or if a figure is not valid JSON) a plain line says so.
emit() {
  local check="$1" ok="$2" line i=0; shift 2
  local args=(--arg check "$check" --argjson ok "$ok" --argjson t "$(elapsed)") filter='{check: $check, ok: $ok}'
  while [ $# -ge 2 ]; do args+=(--argjson "v$i" "$2"); filter+=" + {\"$1\": \$v$i}"; shift 2; i=$((i + 1)); done
  filter+=' + {elapsed_s: $t}'
  line=$(jq -cn "${args[@]}" "$filter" 2>/dev/null) || {
    ok=false
    line="{\"check\":\"$check\",\"ok\":false,\"error\":\"gpu_check: could not write this check's figures as JSON (jq missing or a bad figure)\"}"; }
  # ok null: the check cannot apply yet (what it compares is not written), not a failure.
  [ "$ok" = true ] || [ "$ok" = null ] || [[ " ${failed[*]} " == *" $check "* ]] || failed+=("$check")
  echo "$line" | tee -a "$jsonl"
  save_logs
}
str() { jq -cn --arg s "$1" '$s'; }                        # a shell string as JSON
tail_of() { str "$(tail -n "${2:-15}" "$1" 2>/dev/null)"; } # a log's last lines as JSON
over_budget() { [ "$(elapsed)" -ge "$budget" ]; }
# left: seconds a command started now may run, so that even its kill after
# SIGTERM (timeout -k) comes before the deadline.
left() { echo $(( deadline - kill_after - $(elapsed) )); }
# limit SECONDS: SECONDS, or less where the deadline is nearer (at least 1).
limit() { local l; l=$(left); [ "$l" -ge 1 ] || l=1; echo $(( $1 < l ? $1 : l )); }
# attempt CHECK NEED COMMAND...: runs the check's COMMAND, unless the budget
# is spent or less than NEED seconds (the least it could do with) are left
# before the deadline: then CHECK's line says why it did not start.
attempt() {
  local check="$1" need="$2"; shift 2
  if over_budget; then skip "$check" "not started: over the time budget (${budget} s, $(elapsed) s elapsed)"; return 1; fi
  if [ "$(left)" -lt "$need" ]; then
    skip "$check" "not started: it needs at least $need s, $(left) s are left before the deadline (${deadline} s)"; return 1
  fi
  "$@"
}
# with_caller_libs COMMAND...: COMMAND with the caller's LD_LIBRARY_PATH (set
# or not, as it was), not the prefix's: python's torch must find the
# driver (the GPU image names /usr/local/nvidia there) and its own libraries,
# not a carried one of the same name. A subshell, so a function may be named.
with_caller_libs() {
  (
    if [ "$caller_ld_library_path_set" = 1 ]; then export LD_LIBRARY_PATH="$caller_ld_library_path"; else unset LD_LIBRARY_PATH; fi
    "$@"
  )
}
# The logs so far, in one file ($OUT brings back 8 files at most): after
# every check, so that a run cut short still brings its logs back. Written
# to a temporary file and renamed, so that a kill mid-write leaves the last
# whole archive, never a truncated one.
save_logs() {
  [ -n "${OUT:-}" ] || return 0
  local tmp="$OUT/gpu_logs.partial.tar.gz"
  if tar -czf "$tmp" -C "$logs" . 2>/dev/null; then mv -f "$tmp" "$OUT/gpu_logs.tar.gz"; else rm -f "$tmp"; fi
  return 0
}
# skip CHECK WHY: the check is not run, and says why.
skip() { emit "$1" false skipped "$(str "$2")"; }

# ---- env: what was set when the checks ran (always the first line).
# libcuda: "PATH FROM", the driver library the loader would take first: in
# the caller's LD_LIBRARY_PATH (the GPU image's /usr/local/nvidia is named
# there), ldconfig's cache, or the usual folders; "" where there is none.
libcuda() {
  local d f dirs=()
  IFS=: read -r -a dirs <<<"$caller_ld_library_path"
  for d in "${dirs[@]}"; do
    for f in "$d/libcuda.so.1" "$d/libcuda.so"; do [ -n "$d" ] && [ -e "$f" ] && { echo "$f LD_LIBRARY_PATH"; return; }; done
  done
  f=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" && /x86-64/ { print $NF; exit }')
  [ -z "$f" ] || { echo "$f ldconfig"; return; }
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat; do
    for f in "$d/libcuda.so.1" "$d/libcuda.so"; do [ -e "$f" ] && { echo "$f searched"; return; }; done
  done
}
# The line is made by python's json (jq comes with the prefix, unpacked
# after it); the variables are read there from the environment.
env_py='
import json, os, socket, sys
path, found, real, ld_set, ld, nproc, elapsed, device, dry, budget, deadline, shapes = sys.argv[1:13]
def number(s):
    try: return int(s)
    except ValueError: return s
fixed = {"NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
         "CUBLAS_WORKSPACE_CONFIG", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF",
         "PYTORCH_ALLOC_CONF", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}
def wanted(k):
    return (k in fixed or k.startswith("NCCL_") or (k.startswith("TORCH_") and "TF32" in k)
            or k.startswith("CUBLAS") or k.startswith("CUDNN") or k.startswith("FSDP_"))
print(json.dumps({"check": "env", "ok": True,
                  "variables": {k: v for k, v in sorted(os.environ.items()) if wanted(k)},
                  "ld_library_path": ld if ld_set == "1" else None,
                  "libcuda": path or None, "libcuda_found_in": found or None, "libcuda_real": real or None,
                  "hostname": socket.gethostname(), "nproc": int(nproc),
                  "settings": {"device": device, "dry_run": dry == "1", "budget_s": number(budget),
                               "deadline_s": number(deadline), "bench_shapes": shapes.split()},
                  "elapsed_s": int(elapsed)}, separators=(",", ":")))
'
check_env() {
  local cuda="" from="" real="" line
  read -r cuda from <<<"$(libcuda)"
  [ -z "$cuda" ] || real=$(readlink -f "$cuda")
  line=$(with_caller_libs timeout -k 5 20 "$python" -c "$env_py" "${cuda:-}" "${from:-}" "${real:-}" \
           "$caller_ld_library_path_set" "$caller_ld_library_path" "$cores" "$(elapsed)" \
           "$device" "$dry" "$budget" "$deadline" "$bench_shapes" 2>"$logs/env.log") ||
    line="{\"check\":\"env\",\"ok\":false,\"error\":\"$python could not write the env line (its error is in env.log)\",\"elapsed_s\":$(elapsed)}"
  echo "$line" | tee -a "$jsonl"
  [[ "$line" == *'"ok":true'* ]] || failed+=(env)
  save_logs
}

# deb_tar DEB ARGS...: tar ARGS on a .deb's data (dpkg-deb where the image
# has it, else ar, which the CUDA toolchain's binutils brings).
deb_tar() {
  local deb="$1"; shift
  if command -v dpkg-deb >/dev/null; then dpkg-deb --fsys-tarfile "$deb" | tar "$@"; return; fi
  local member; member=$(ar t "$deb" | grep '^data\.tar') || return 1
  case "$member" in
    *.xz) ar p "$deb" "$member" | xz -dc | tar "$@" ;;
    *.zst) ar p "$deb" "$member" | zstd -dc | tar "$@" ;;
    *.gz) ar p "$deb" "$member" | gzip -dc | tar "$@" ;;
    *) ar p "$deb" "$member" | tar "$@" ;;
  esac
}

# ---- prefix: Debian 12's OpenMPI and the build's dependencies, unpacked from
# .gpu-carry/ (scripts/gpu_carry.sh) into a private prefix, never into /.
unpack_prefix() {
  local debs=(.gpu-carry/*.deb)
  [ -e "${debs[0]}" ] || { echo "expected .gpu-carry/*.deb (run scripts/gpu_carry.sh, and name .gpu-carry in the device tool's carry); found none"; return 1; }
  rm -rf "$prefix" && mkdir -p "$prefix" || return 1
  for d in "${debs[@]}"; do deb_tar "$d" -x -f - -C "$prefix" || { echo "unpacking $d failed (dpkg-deb, or ar with xz)"; return 1; }; done
  local u="$prefix/usr" l="$prefix/usr/lib/x86_64-linux-gnu"
  # The links Debian's maintainer scripts make (update-alternatives), which
  # dpkg -x does not run.
  for t in mpirun mpiexec mpicxx mpicc mpic++; do ln -sf "$t.openmpi" "$u/bin/$t"; done
  ln -sf openmpi/lib/libmpi.so "$l/libmpi.so"
  ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$l/libpsm_infinipath.so.1"
  # A library the image has already (an Ubuntu 24.04's is the newer) is not
  # put ahead of it on LD_LIBRARY_PATH, where it would shadow it for
  # LibTorch, NCCL and Python too: a dependency package whose every soname
  # the system has is left out. OpenMPI's own (with PMIx, hwloc and
  # libevent, which it was built against) always come from the prefix.
  pruned=()
  for d in "${debs[@]}"; do
    local pkg; pkg=$(basename "$d"); pkg=${pkg%%_*}
    case "$pkg" in openmpi-*|libopenmpi*|libpmix*|libhwloc*|libevent*) continue ;; esac
    local listing files; listing=$(deb_tar "$d" -t -f - | sed 's|^\./||')
    files=$(grep -E '/lib[^/]*\.so\.[0-9]+$' <<<"$listing")
    [ -n "$files" ] || continue
    local all=1 f
    for f in $files; do
      local at; at=$(ldconfig -p | awk -v s="$(basename "$f")" '$1 == s && /x86-64/ { print $NF; exit }')
      [ -n "$at" ] && [ -f "$at" ] && [ -s "$at" ] || { all=0; break; }  # in the cache and really there
    done
    if [ "$all" = 1 ]; then
      for f in $(grep -E '\.so(\.[0-9]+)*$' <<<"$listing"); do rm -f "$prefix/$f"; done
      pruned+=("$pkg")
    fi
  done
  [ -s data/default_corpus.txt ] || { mkdir -p data && cp .gpu-carry/default_corpus.txt data/; } ||
    { echo "expected data/default_corpus.txt or .gpu-carry/default_corpus.txt; found neither"; return 1; }
}
prefix_env() {
  local u="$prefix/usr" l="$prefix/usr/lib/x86_64-linux-gnu"
  export PATH="$u/bin:$PATH"
  export LD_LIBRARY_PATH="$l:$l/openmpi/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # OpenMPI is relocatable through OPAL_PREFIX (its other folders follow);
  # PMIx and hwloc keep their configured absolute paths, so their plugin
  # folders are named here (hwloc's points at none: its built-in Linux
  # discovery is all OpenMPI needs).
  export OPAL_PREFIX="$u" PMIX_MCA_mca_base_component_path="$l/pmix2/lib/pmix" HWLOC_PLUGINS_PATH="$l/hwloc"
  export CMAKE_PREFIX_PATH="$u${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # Root, one host: mpirun's own consent variables (fsdp-run passes the flag;
  # ctest or a singleton may not); shared memory between ranks, no network
  # transports to probe (UCX, libfabric, verbs).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx OMPI_MCA_rmaps_base_oversubscribe=1
}
# check_prefix: unpacks the prefix and starts an MPI program both ways
# fsdp-cpp's start; sets launch (mpirun, singleton or none). Its status is
# its own verdict: 0 only where both ways work.
check_prefix() {
  local t0=$EPOCHREALTIME log="$logs/prefix.log" why
  pruned=()
  unpack_prefix > "$logs/unpack.log" 2>&1  # not in $(...): it sets pruned
  local rc=$?
  why=$(tail -5 "$logs/unpack.log")
  prefix_env
  if [ $rc -ne 0 ] || ! jq -n 1 >/dev/null 2>&1; then
    launch=none
    echo "{\"check\":\"prefix\",\"ok\":false,\"launch\":\"none\",\"error\":$(printf '%s' "${why:-jq not found in the prefix}" | with_caller_libs python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))' 2>/dev/null || echo '"unpacking failed"')}" | tee -a "$jsonl"
    failed+=(prefix); save_logs; return 1
  fi
  # An MPI program built with the prefix's mpicxx, started both ways
  # fsdp-cpp's are: as mpirun's ranks, and as a singleton (started without
  # mpirun, it starts orted from the prefix itself).
  printf '%s\n' '#include <mpi.h>' '#include <cstdio>' \
    'int main(int c, char** v) { MPI_Init(&c, &v); int r, n, x, s = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r);' \
    '  MPI_Comm_size(MPI_COMM_WORLD, &n); x = r + 1; MPI_Allreduce(&x, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);' \
    '  std::printf("rank %d of %d: sum %d\n", r, n, s); MPI_Finalize(); return s != n * (n + 1) / 2; }' > "$logs/mpi_hello.cpp"
  rm -f "$logs/mpi_hello"
  timeout -k 5 "$(limit 90)" mpicxx -o "$logs/mpi_hello" "$logs/mpi_hello.cpp" > "$log" 2>&1
  local compile_rc=$? mpirun_rc=null singleton_rc=null
  if [ $compile_rc -eq 0 ]; then
    echo "-- mpirun -n 2:" >> "$log"
    timeout -k 5 "$(limit 30)" mpirun --allow-run-as-root --oversubscribe -n 2 "$logs/mpi_hello" >> "$log" 2>&1
    mpirun_rc=$?
    echo "-- singleton:" >> "$log"
    timeout -k 5 "$(limit 30)" "$logs/mpi_hello" >> "$log" 2>&1
    singleton_rc=$?
  fi
  local version; version=$(timeout -k 5 20 ompi_info --version 2>/dev/null | head -1)
  local ok=false verdict
  if [ "$mpirun_rc" = 0 ] && [ "$singleton_rc" = 0 ]; then
    ok=true launch=mpirun verdict="mpirun -n 2 and a singleton work"
  elif [ "$singleton_rc" = 0 ]; then
    launch=singleton
    verdict="mpirun -n 2 failed (status $mpirun_rc), a singleton works: one-rank runs go on as singletons, runs of 2 and 4 ranks are skipped"
  elif [ $compile_rc -ne 0 ]; then
    launch=none verdict="mpicxx could not build an MPI hello (status $compile_rc): nothing MPI can run"
  else
    launch=none
    verdict="a singleton failed (status $singleton_rc; mpirun -n 2: $mpirun_rc): fsdp-train calls MPI_Init, nothing can run"
  fi
  emit prefix "$ok" launch "$(str "$launch")" verdict "$(str "$verdict")" prefix "$(str "$prefix")" \
    openmpi "$(str "$version")" packages "$(find .gpu-carry -maxdepth 1 -name '*.deb' 2>/dev/null | wc -l)" \
    pruned "$(printf '%s\n' "${pruned[@]}" | jq -Rsc 'split("\n") | map(select(length > 0))')" \
    compile_rc "$compile_rc" mpirun_rc "$mpirun_rc" singleton_rc "$singleton_rc" log "$(tail_of "$log" 8)" \
    os "$(str "$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}") / glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')")" \
    seconds "$(seconds_since "$t0")"
  [ "$ok" = true ]
}

# ---- the GPU itself.
torch_probe_py='
import json, torch
b = torch.backends
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                  "devices": torch.cuda.device_count(),
                  "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "matmul_allow_tf32": b.cuda.matmul.allow_tf32, "cudnn_allow_tf32": b.cudnn.allow_tf32,
                  "float32_matmul_precision": torch.get_float32_matmul_precision()}))
'
check_gpu() {
  local q probe
  probe=$(with_caller_libs timeout -k 5 "$(limit 90)" "$python" -c "$torch_probe_py" 2>"$logs/torch_probe.log" | tail -1)
  jq -e . >/dev/null 2>&1 <<<"$probe" || probe=$(str "torch probe failed: $(tail -3 "$logs/torch_probe.log")")
  if ! q=$(timeout -k 5 "$(limit 30)" nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,compute_mode \
             --format=csv,noheader,nounits 2>&1); then
    emit gpu false error "$(str "nvidia-smi failed or is missing: $q")" torch "$probe"; return
  fi
  IFS=, read -r name mem driver cc mode <<<"$(head -1 <<<"$q")"
  local ok=false; [ "$(jq -r '.cuda_available? // false' <<<"$probe")" = true ] && ok=true
  # Ranks sharing the GPU (parity's W = 2, 4) need the Default compute mode.
  emit gpu "$ok" name "$(str "${name# }")" memory_mib "$(str "${mem// /}")" driver "$(str "${driver// /}")" \
    compute_capability "$(str "${cc// /}")" compute_mode "$(str "${mode// /}")" count "$(wc -l <<<"$q")" torch "$probe"
}

# ---- NCCL through PyTorch, one rank, before the build: whether NCCL works
# on this machine at all (FSDP_GPU_CHECK_DEVICE=cpu: gloo, the same code).
nccl_torch_py='
import datetime, faulthandler, json, os, sys, time
t0 = time.time()
device, store, hard = sys.argv[1], sys.argv[2], int(sys.argv[3])
faulthandler.dump_traceback_later(max(1, hard - 3), exit=True)  # a hang shows where it was
out = {"stage": "import torch"}
def done(ok, **kw):
    out.update(kw); out["ok"] = ok; out["seconds"] = round(time.time() - t0, 1)
    print("NCCL_TORCH_RESULT " + json.dumps(out), flush=True)
    sys.exit(0 if ok else 1)
try:
    import torch, torch.distributed as dist
    out["torch"] = torch.__version__
    kw = dict(init_method="file://" + store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    if device == "cuda":
        out["backend"] = kw["backend"] = "nccl"
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        out["stage"] = "cuda init"
        torch.cuda.set_device(0)
        kw["device_id"] = torch.device("cuda", 0)  # the communicator is made in init_process_group
    else:
        out["backend"] = kw["backend"] = "gloo"
    out["stage"] = "init_process_group"
    dist.init_process_group(**kw)
    out["stage"] = "all_reduce"
    x = torch.full((1 << 20,), 3.0, device=device)
    dist.all_reduce(x)
    if device == "cuda":
        torch.cuda.synchronize()
    got = x[0].item()
    out["stage"] = "destroy_process_group"
    dist.destroy_process_group()
    out["stage"] = "done"
    done(got == 3.0, sum=got)  # world size 1: the sum is the rank own value
except Exception as e:
    done(False, error=(type(e).__name__ + ": " + str(e))[:2000])
'
check_nccl_torch() {
  local log="$logs/nccl_torch.log" store="$logs/nccl_torch.store" lim res
  rm -f "$store" "$logs"/nccl_torch.*.nccl.log
  lim=$(limit 45)  # torch's import and CUDA's start; the all-reduce itself times out after 10 s
  with_caller_libs timeout -k 5 "$lim" env NCCL_DEBUG="$nccl_debug" NCCL_DEBUG_FILE="$logs/nccl_torch.%h.%p.nccl.log" \
    "$python" -c "$nccl_torch_py" "$device" "$store" "$lim" > "$log" 2>&1
  local rc=$?
  res=$(sed -n 's/^NCCL_TORCH_RESULT //p' "$log" | tail -1)
  jq -e . >/dev/null 2>&1 <<<"$res" || res='{"ok": false, "error": "no result: the probe was killed or crashed (see log)"}'
  local ok; ok=$(jq -r '.ok == true' <<<"$res"); [ $rc -eq 0 ] || ok=false
  emit nccl_torch "$ok" world_size 1 rc "$rc" limit_s "$lim" result "$res" \
    log "$( [ "$ok" = true ] && str "" || tail_of "$log" 12)" \
    nccl_debug "$(str "$(cat "$logs"/nccl_torch.*.nccl.log 2>/dev/null | tail -n 12)")"
}

# ---- configure and build.
# find_libtorch: FSDP_LIBTORCH, or the folder of python's torch (asked only
# when configuring, with the caller's libraries, in a time limit).
find_libtorch() {
  [ -z "${FSDP_LIBTORCH:-}" ] || { echo "$FSDP_LIBTORCH"; return; }
  with_caller_libs timeout -k 5 "$(limit 90)" "$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null | tail -1
}
check_configure() {
  local log="$logs/configure.log" t0=$EPOCHREALTIME libtorch
  libtorch=$(find_libtorch)
  if [ -z "$libtorch" ]; then
    emit configure false error "$(str "expected FSDP_LIBTORCH or a $python that imports torch; found neither")"; return 1
  fi
  # Only Hopper's code (sm_90) is compiled: the build is the slow part.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  local lim; lim=$(limit 180)
  # shellcheck disable=SC2086
  timeout -k 10 "$lim" cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSDP_LIBTORCH="$libtorch" \
    -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DMPI_HOME="$prefix/usr" -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec" \
    ${FSDP_GPU_CMAKE_ARGS:-} > "$log" 2>&1
  local rc=$?
  local cache="$build/CMakeCache.txt" mpi_lib="" cuda=""
  mpi_lib=$(sed -n 's/^MPI_mpi_LIBRARY:FILEPATH=//p' "$cache" 2>/dev/null)
  cuda=$(sed -n 's/^FSDP_CUDA:[A-Z]*=//p' "$cache" 2>/dev/null)
  grep -A4 'not used by the project' "$log" | grep -qx ' *FSDP_CUDA' && cuda="not an option of this CMakeLists.txt"
  # What was carried must be found in the prefix: a system copy would hide a
  # broken carry (and on the GPU machine there is none).
  local outside; outside=$(grep -E '^(MPI_mpi_LIBRARY|MPI_CXX_HEADER_DIR|MPIEXEC_EXECUTABLE|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|xxHash_INCLUDE_DIR|xxHash_LIBRARY):' "$cache" 2>/dev/null |
                           grep -v "=$prefix/" | jq -Rsc 'split("\n") | map(select(length > 0))')
  local ok=false; [ $rc -eq 0 ] && [[ "$mpi_lib" == "$prefix"/* ]] && [ "$outside" = "[]" ] && ok=true
  emit configure "$ok" libtorch "$(str "$(sed -n 's/^-- fsdp-cpp: LibTorch //p' "$log" | tail -1)")" \
    mpi_library "$(str "$mpi_lib")" outside_prefix "${outside:-null}" fsdp_cuda "$(str "${cuda:-unset}")" \
    rc "$rc" limit_s "$lim" seconds "$(seconds_since "$t0")" \
    log "$( [ "$ok" = true ] && str "" || tail_of "$log" 25)"
  [ "$ok" = true ]
}
# check_build TARGET...: the checks' targets (the trainer, the launcher's
# probe and the GPU tests' binary), not the whole tree. The CUDA module
# (libfsdp_cuda.so, which --device cuda loads: src/comm/cuda_module.h) is
# built with libfsdp, so with any of them; the line says whether it is there.
check_build() {
  local log="$logs/build.log" t0=$EPOCHREALTIME lim; lim=$(limit 360)
  # -k 0: one target that fails to compile does not keep the others (the
  # trainer, say) from being built and checked.
  timeout -k 10 "$lim" cmake --build "$build" -j "$jobs" --target "$@" -- -k 0 > "$log" 2>&1
  local rc=$? ok=false module=false; [ $rc -eq 0 ] && ok=true
  [ -f "$build/libfsdp_cuda.so" ] && module=true
  [ "$device" != cuda ] || [ $module = true ] || ok=false
  emit build "$ok" target "$(str "$*")" cuda_module "$module" jobs "$jobs" rc "$rc" limit_s "$lim" seconds "$(seconds_since "$t0")" \
    log "$( [ "$ok" = true ] && str "" || grep -E -m 12 -B2 -A4 'error|FAILED' "$log" | tail -40 | jq -Rs .)"
}

# ---- the library's NCCL smoke (tests/test_devices.cpp's NcclSmoke.*), run
# as an MPI singleton: gtest's summary says passed, skipped (no GPU) or
# failed. One-rank runs with --backend auto (parity_w1, bench, offload) do
# their collectives as device copies and use no NCCL: they do not depend on
# this check.
test_devices() {  # its path: tests/CMakeLists.txt builds it in $build/tests
  if [ -x "$build/tests/test_devices" ] || [ ! -x "$build/test_devices" ]; then echo "$build/tests/test_devices"; else echo "$build/test_devices"; fi
}
check_nccl() {
  local log="$logs/nccl_smoke.log" lim; lim=$(limit 30)
  rm -f "$logs"/nccl_smoke.*.nccl.log
  timeout -k 5 "$lim" env NCCL_DEBUG="$nccl_debug" NCCL_DEBUG_FILE="$logs/nccl_smoke.%h.%p.nccl.log" \
    "$(test_devices)" --gtest_filter='NcclSmoke.*' > "$log" 2>&1
  local rc=$?
  # gtest's summary: "[==========] N tests from M test suites ran.",
  # "[  PASSED  ] N tests.", "[  SKIPPED ] N tests, listed below:", "[  FAILED  ] N tests, listed below:".
  local ran passed skipped failed_n status
  ran=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$log" | tail -1)
  passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$log" | tail -1)
  skipped=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below.*/\1/p' "$log" | tail -1)
  failed_n=$(sed -nE 's/^\[  FAILED  \] ([0-9]+) tests?, listed below.*/\1/p' "$log" | tail -1)
  ran=${ran:-0} passed=${passed:-0} skipped=${skipped:-0} failed_n=${failed_n:-0}
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timed_out
  elif [ "$failed_n" -gt 0 ]; then status=failed
  elif [ $rc -ne 0 ]; then status=crashed
  elif [ "$ran" -eq 0 ]; then status=absent  # the filter matched no test: an older test_devices
  elif [ "$skipped" -gt 0 ]; then status=skipped
  else status=passed
  fi
  local ok=false; [ $status = passed ] && ok=true
  emit nccl "$ok" status "$(str "$status")" ran "$ran" passed "$passed" skipped "$skipped" failed "$failed_n" \
    rc "$rc" limit_s "$lim" \
    w1_runs_use_nccl false \
    note '"one-rank runs (--backend auto: parity_w1, bench, offload) use a size-1 group of device copies, no NCCL; W = 2, 4 run over MPI"' \
    log "$(tail_of "$log" 15)" nccl_debug "$(str "$(cat "$logs"/nccl_smoke.*.nccl.log 2>/dev/null | tail -n 12)")"
}

# ---- the GPU tests: ctest's label gpu (each exits 77, ctest's "skipped",
# without a GPU: on this machine a skip is a failure), but trainer_gpu: its
# runs are the parity and offload checks' again.
check_tests() {
  local log="$logs/ctest-gpu.log" lim; lim=$(limit 260)
  # --timeout: each test's own limit where it sets none; the outer one ends
  # ctest and what it started (timeout signals its whole process group).
  timeout -k 10 "$lim" ctest --test-dir "$build" -L gpu -E '^trainer_gpu$' --timeout "$lim" --output-on-failure > "$log" 2>&1
  local rc=$?
  # ctest's lines: "1/3 Test #4: NAME ....   Passed  1.2 sec" (or ***Failed, ***Skipped, ***Not Run, ...).
  local results; results=$(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?(Not Run|[A-Za-z]+).*/\1 \3/p' "$log")
  local total passed skipped
  total=$(grep -c . <<<"$results"); passed=$(grep -c ' Passed$' <<<"$results"); skipped=$(grep -c ' Skipped$' <<<"$results")
  [ -n "$results" ] || total=0
  local ok=false; [ $rc -eq 0 ] && [ "$total" -gt 0 ] && [ "$skipped" -eq 0 ] && ok=true
  emit tests "$ok" label '"gpu"' total "$total" passed "$passed" skipped "$skipped" rc "$rc" limit_s "$lim" \
    not_passed "$(grep -v ' Passed$' <<<"$results" | jq -Rsc 'split("\n") | map(select(length > 0))')" \
    log "$( [ "$ok" = true ] && str "" || tail_of "$log" 30)"
}

# train NAME RANKS ARGS...: fsdp-train through fsdp-run, its summary in
# $logs/NAME.json and per-step log in $logs/NAME.jsonl; the status is
# fsdp-run's. Where mpirun is broken (launch=singleton), a one-rank run is
# fsdp-train started directly, an MPI singleton, with fsdp-run's thread
# settings for one rank; a run of more ranks cannot start.
train() {
  local name="$1" ranks="$2"; shift 2
  rm -f "$logs/$name.json" "$logs/$name.jsonl"
  local start_ranks=("$build/fsdp-run" -n "$ranks" --)
  if [ "$launch" != mpirun ]; then
    if [ "$ranks" != 1 ]; then
      echo "gpu_check: expected mpirun to start $ranks ranks; the prefix check found it broken (launch: $launch)" > "$logs/$name.log"
      return 1
    fi
    start_ranks=(env OMP_NUM_THREADS="$cores" OPENBLAS_NUM_THREADS="$cores" MKL_NUM_THREADS="$cores" FSDP_THREADS_PER_RANK="$cores")
  fi
  timeout -k "$kill_after" "$(limit 150)" "${start_ranks[@]}" "$build/fsdp-train" "$@" \
    --summary "$logs/$name.json" --log "$logs/$name.jsonl" > "$logs/$name.log" 2>&1
}
# figure FILE KEY: a summary's number (the largest, where it is per rank).
figure() { jq -c --arg k "$2" '.[$k] | if type == "array" then max else . end // null' "$1" 2>/dev/null || echo null; }
# ratio A B: A / B to 3 decimals, or null where either is not a positive number.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "null" }'; }
reldiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; printf "%.3g", (m > 0 ? d / m : d) }'; }

# ---- parity, fp32: the small preset, global batch 8 as W ranks x 8/W on the
# one GPU (W = 2, 4 over MPI's host-staged collectives: NCCL refuses two ranks
# on one device), and on the CPU. parity_w1 (first: GPU against CPU at one
# rank, --backend auto, no NCCL) and parity_w2_w4 (later, against parity_w1's
# GPU run, which is not run again).
parity_common=()
parity_init() {
  parity_common=(--preset "$parity_preset" --steps "$parity_steps" --strategy full_shard --param-dtype fp32
                 --print-every "$parity_steps")
  finals="{}" errors="{}" diffs="{}" parity_ok=true
}
# parity_run NAME RANKS ARGS...: one run, its final loss into finals (or its
# log's tail into errors).
parity_run() {
  local name="$1" ranks="$2"; shift 2
  if train "parity_$name" "$ranks" "${parity_common[@]}" "$@"; then
    finals=$(jq -c --arg n "$name" --argjson v "$(figure "$logs/parity_$name.json" final_loss)" '. + {($n): $v}' <<<"$finals")
  else
    errors=$(jq -c --arg n "$name" --argjson v "$(tail_of "$logs/parity_$name.log" 8)" '. + {($n): $v}' <<<"$errors")
    parity_ok=false
  fi
}
# parity_diff NAME TOL: NAME's relative differences to cuda_w1 (its summary
# and log in $logs), the final loss's and the largest over all steps (the
# logs' .loss), into diffs; parity_ok false where the final one is past TOL.
parity_diff() {
  local name="$1" tol="$2" ref v final steps
  ref=$(figure "$logs/parity_cuda_w1.json" final_loss)
  v=$(jq -r --arg n "$name" '.[$n] // empty' <<<"$finals")
  if [ "$ref" = null ] || [ -z "$v" ] || [ "$v" = null ]; then parity_ok=false; return; fi
  final=$(reldiff "$v" "$ref")
  steps=$(paste <(jq -r .loss "$logs/parity_$name.jsonl" 2>/dev/null) <(jq -r .loss "$logs/parity_cuda_w1.jsonl" 2>/dev/null) |
          awk '{ d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; r = m > 0 ? d / m : d; if (r > x) x = r; n++ }
               END { if (n) printf "%.3g", x; else print "null" }')
  diffs=$(jq -c --arg n "$name" --argjson f "$final" --argjson s "$steps" --argjson t "$tol" \
          '. + {($n): {final_rel: $f, max_step_rel: $s, tol: $t}}' <<<"$diffs")
  awk -v d="$final" -v t="$tol" 'BEGIN { exit !(d <= t) }' || parity_ok=false
}
check_parity_w1() {
  parity_init
  parity_run cuda_w1 1 --device "$device" --backend auto --batch 8
  parity_run cpu_w1 1 --device cpu --batch 8
  parity_diff cpu_w1 1e-4
  emit parity_w1 "$parity_ok" device "$(str "$device")" preset "$(str "$parity_preset")" steps "$parity_steps" \
    launch "$(str "$launch")" final_loss "$finals" vs_cuda_w1 "$diffs" errors "$errors"
}
check_parity_w2_w4() {
  parity_init
  local ref; ref=$(figure "$logs/parity_cuda_w1.json" final_loss)
  [ "$ref" != null ] || { parity_ok=false; errors='{"cuda_w1": "no final loss of parity_w1'"'"'s cuda_w1 run to compare with"}'; }
  parity_run cuda_w2 2 --device "$device" --backend mpi --batch 4
  parity_run cuda_w4 4 --device "$device" --backend mpi --batch 2
  parity_diff cuda_w2 1e-5
  parity_diff cuda_w4 1e-5
  emit parity_w2_w4 "$parity_ok" device "$(str "$device")" preset "$(str "$parity_preset")" steps "$parity_steps" \
    reference "$(jq -cn --argjson v "$ref" '{cuda_w1: $v}')" final_loss "$finals" vs_cuda_w1 "$diffs" errors "$errors"
}

# ---- the benchmark, bf16 at W = 1: fsdp-cpp full_shard against PyTorch
# FSDP2 fully_shard, on two shapes with one batch. MFU = tokens/s x
# flops_per_token / peak, flops_per_token = 6 N + 12 L C T (PaLM's and
# nanoGPT's estimate: the matmuls' 6 per parameter, plus attention's),
# N every parameter of the reference GPT (tied head counted once).
shape_args() {  # SHAPE: fsdp-train's, fsdp-plan's and peer.py's shape flags
  case "$1" in
    large) echo "--preset large" ;;
    gpt2_124m) echo "--preset large --vocab 50304 --context 1024 --layers 12 --heads 12 --width 768" ;;
    tiny) echo "--preset tiny" ;;  # the suite's check of this script, on a CPU
  esac
}
shape_dims() {  # SHAPE: vocab context layers width
  case "$1" in
    large) echo "256 256 12 1024" ;;
    gpt2_124m) echo "50304 1024 12 768" ;;
    tiny) echo "256 32 2 64" ;;
  esac
}
flops_per_token() {
  local v t l c; read -r v t l c <<<"$(shape_dims "$1")"
  awk -v v="$v" -v t="$t" -v l="$l" -v c="$c" 'BEGIN {
    n = v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c
    printf "%d %d\n", n, 6 * n + 12 * l * c * t }'
}
# bench_line CHECK ENGINE SHAPE SUMMARY LOG: the figures of one run.
bench_line() {
  local check="$1" engine="$2" shape="$3" summary="$4" log="$5" n fpt
  read -r n fpt <<<"$(flops_per_token "$shape")"
  if [ ! -s "$summary" ]; then
    emit "$check" false engine "$(str "$engine")" shape "$(str "$shape")" error "$(tail_of "$log" 12)"; return 1
  fi
  local tps peak
  tps=$(figure "$summary" tokens_per_s); peak=$(figure "$summary" peak_device_bytes)
  local ok=true; [ "$tps" = null ] || [ "$peak" = null ] && ok=false
  emit "$check" "$ok" engine "$(str "$engine")" shape "$(str "$shape")" batch "$bench_batch" steps "$bench_steps" \
    tokens_per_s "$tps" step_s "$(figure "$summary" step_s)" peak_device_bytes "$peak" \
    peak_device_reserved_bytes "$(figure "$summary" peak_device_reserved_bytes)" \
    peak_device_gib "$(ratio "$peak" 1073741824)" n_params "$n" flops_per_token "$fpt" \
    mfu "$(awk -v x="$tps" -v f="$fpt" -v p="$peak_flops" 'BEGIN { if (x + 0 > 0) printf "%.4g", x * f / p; else print "null" }')" \
    final_loss "$(figure "$summary" final_loss)" \
    device_memory_by_category "$(jq -c '.device_memory_by_category // null' "$summary" 2>/dev/null || echo null)"
}
bench_ours() {  # NAME SHAPE [MORE ARGS]: fsdp-train bf16 full_shard at W=1 (no NCCL: a size-1 group)
  local name="$1" shape="$2"; shift 2
  # shellcheck disable=SC2046
  train "$name" 1 $(shape_args "$shape") --batch "$bench_batch" --steps "$bench_steps" --print-every "$bench_steps" \
    --device "$device" --backend auto --param-dtype bf16 --reduce-dtype fp32 --strategy full_shard "$@"
}
bench_peer() {  # NAME SHAPE: PyTorch FSDP2 at W=1 (a 1-rank NCCL group, no torchrun)
  local name="$1" shape="$2"
  rm -f "$logs/$name.json"
  # shellcheck disable=SC2046
  with_caller_libs timeout -k "$kill_after" "$(limit 150)" "$python" bench/peer.py --engine fsdp2 --device "$device" --dtype bf16 \
    $(shape_args "$shape") --batch "$bench_batch" --steps "$bench_steps" --summary "$logs/$name.json" > "$logs/$name.log" 2>&1
}
# check_bench SHAPE: fsdp-cpp's run and FSDP2's, then the two compared.
check_bench() {
  local shape="$1"
  bench_ours "bench_fsdp_cpp_$shape" "$shape"
  bench_line bench fsdp_cpp "$shape" "$logs/bench_fsdp_cpp_$shape.json" "$logs/bench_fsdp_cpp_$shape.log"
  bench_peer "bench_fsdp2_$shape" "$shape"
  bench_line bench torch_fsdp2 "$shape" "$logs/bench_fsdp2_$shape.json" "$logs/bench_fsdp2_$shape.log"
  # The goals: tokens/s at least FSDP2's, peak device memory at most FSDP2's.
  local a="$logs/bench_fsdp_cpp_$shape.json" b="$logs/bench_fsdp2_$shape.json"
  if [ -s "$a" ] && [ -s "$b" ]; then
    local tr mr
    tr=$(ratio "$(figure "$a" tokens_per_s)" "$(figure "$b" tokens_per_s)")
    mr=$(ratio "$(figure "$a" peak_device_bytes)" "$(figure "$b" peak_device_bytes)")
    local ok=false; awk -v t="$tr" -v m="$mr" 'BEGIN { exit !(t != "null" && m != "null" && t >= 1 && m <= 1) }' && ok=true
    emit bench_vs_fsdp2 "$ok" shape "$(str "$shape")" tokens_per_s_ratio "$tr" peak_device_ratio "$mr" \
      goal '"tokens_per_s_ratio >= 1 and peak_device_ratio <= 1"'
  else
    emit bench_vs_fsdp2 false shape "$(str "$shape")" error '"a run gave no summary"'
  fi
}

# ---- offload: the first shape's (large's) bf16 run with --offload cpu
# against the same run without, at FSDP_GPU_OFFLOAD_BATCH sequences (goal:
# peak device memory at most 0.35 x). At the bench's 16 activations
# outweigh the model state (fsdp-plan: 0.45 x at 16, 0.20 x at 4), and
# offload moves only the model state.
check_offload() {
  local shape="${bench_shapes%% *}"  # its own local: one local's later words would see the caller's shape
  local b="$logs/bench_fsdp_cpp_${shape}_b$offload_batch.json" a="$logs/bench_fsdp_cpp_${shape}_b${offload_batch}_offload.json"
  bench_batch="$offload_batch" bench_ours "bench_fsdp_cpp_${shape}_b$offload_batch" "$shape"
  bench_batch="$offload_batch" bench_line offload_run fsdp_cpp "$shape" "$b" "${b%.json}.log"
  bench_batch="$offload_batch" bench_ours "bench_fsdp_cpp_${shape}_b${offload_batch}_offload" "$shape" --offload cpu
  bench_batch="$offload_batch" bench_line offload_run fsdp_cpp_offload_cpu "$shape" "$a" "${a%.json}.log"
  if [ -s "$a" ] && [ -s "$b" ]; then
    local mr tr
    mr=$(ratio "$(figure "$a" peak_device_bytes)" "$(figure "$b" peak_device_bytes)")
    tr=$(ratio "$(figure "$a" tokens_per_s)" "$(figure "$b" tokens_per_s)")
    local ok=false; awk -v m="$mr" 'BEGIN { exit !(m != "null" && m <= 0.35) }' && ok=true
    emit offload "$ok" shape "$(str "$shape")" batch "$offload_batch" peak_device_ratio "$mr" tokens_per_s_ratio "$tr" \
      predicted_ratio "$(ratio "$(figure "$a" peak_device_bytes_predicted)" "$(figure "$b" peak_device_bytes_predicted)")" \
      offload_reported "$(jq -c '.offload // null' "$a")" goal '"peak_device_ratio <= 0.35"'
  else
    emit offload false error '"the offload run or the run without gave no summary"'
  fi
}

# ---- the device code written since issue 25's review (issue 42). Each at
# W = 1 (--backend auto: the group of one, no NCCL) on parity's preset in
# fp32, against a run without it; parity_w1's GPU run is that run where
# the flags are the same (it is made here if parity_w1 did not run).
w1_args() {  # STEPS: parity_w1's GPU run's flags, with STEPS steps
  echo --preset "$parity_preset" --steps "$1" --strategy full_shard --param-dtype fp32 --print-every "$1" \
    --device "$device" --backend auto --batch 8
}
scratch() { local d; d="$(dirname "$logs")/gpu-scratch"; mkdir -p "$d" && echo "$d"; }  # big files, not archived
w1_baseline() {
  [ -s "$logs/parity_cuda_w1.json" ] || { parity_init; parity_run cuda_w1 1 --device "$device" --backend auto --batch 8; }
}
# loss_rel A B [TOL]: run A's losses against run B's ($logs/A.json(l)):
# {"final_rel", "max_step_rel", "tol", "within"}; the relative differences
# are null (and within false) where either run has no losses.
loss_rel() {
  local fa fb final steps
  fa=$(figure "$logs/$1.json" final_loss); fb=$(figure "$logs/$2.json" final_loss)
  final=null; [ "$fa" = null ] || [ "$fb" = null ] || final=$(reldiff "$fa" "$fb")
  steps=$(paste <(jq -r .loss "$logs/$1.jsonl" 2>/dev/null) <(jq -r .loss "$logs/$2.jsonl" 2>/dev/null) |
          awk '{ d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; r = m > 0 ? d / m : d; if (r > x) x = r; n++ }
               END { if (n) printf "%.3g", x; else print "null" }')
  jq -cn --argjson f "$final" --argjson s "$steps" --argjson t "${3:-0}" \
    '{final_rel: $f, max_step_rel: $s, tol: $t, within: ($f != null and $s != null and $f <= $t and $s <= $t)}'
}
# zeropp: ZeRO++'s int8 gather (qwZ) at one rank. The gather of a group of
# one is a copy of the packed blocks (the local group on a GPU), so packing,
# the gathered layout and unpacking all run; the traffic saved is counted,
# not sent. hpZ and qgZ need a host of several ranks: not here.
check_zeropp() {
  w1_baseline
  # shellcheck disable=SC2046
  train w1_int8_gather 1 $(w1_args "$parity_steps") --gather-quantization int8
  local a="$logs/w1_int8_gather.json" b="$logs/parity_cuda_w1.json"
  [ -s "$a" ] || { emit zeropp false error "$(tail_of "$logs/w1_int8_gather.log" 12)"; return; }
  local bytes diff ok=false
  bytes=$(ratio "$(jq '.comm_bytes.all_gather // 0' "$a")" "$(jq '.comm_bytes.all_gather // 0' "$b" 2>/dev/null)")
  diff=$(loss_rel w1_int8_gather parity_cuda_w1 2e-2)
  # int8 blocks of 64 with an fp32 scale each: (64 + 4) / 256 of fp32's bytes.
  jq -e '.within' <<<"$diff" > /dev/null && awk -v r="$bytes" 'BEGIN { exit !(r != "null" && r < 0.3) }' && ok=true
  emit zeropp "$ok" backend "$(jq -c .backend "$a")" gather_quantization "$(jq -c .gather_quantization "$a")" \
    gather_bytes_ratio "$bytes" vs_cuda_w1 "$diff" \
    note '"one rank: the int8 gather runs through the group of one (its packed blocks copied), so it is checked, not its traffic; hpZ and qgZ need several ranks on a host"'
}
# ckpt_async: the run saves at half way and at its end in the background
# (staged to host memory first); it trains as parity_w1's run, and a run
# resumed from the half-way checkpoint ends where it ended: what was staged
# is what was trained.
check_ckpt_async() {
  w1_baseline
  local dir resumed half=$(( parity_steps / 2 )); dir="$(scratch)/ckpt_async"; resumed="$(scratch)/ckpt_resumed"
  rm -rf "$dir" "$resumed"
  # shellcheck disable=SC2046
  train w1_ckpt_async 1 $(w1_args "$parity_steps") --ckpt-dir "$dir" --ckpt-every "$half" --ckpt-keep 4 --ckpt-async
  local a="$logs/w1_ckpt_async.json"
  [ -s "$a" ] || { emit ckpt_async false error "$(tail_of "$logs/w1_ckpt_async.log" 12)"; return; }
  mkdir -p "$resumed" && cp -r "$dir/step-$half" "$resumed/" 2>/dev/null
  # shellcheck disable=SC2046
  train w1_ckpt_resumed 1 $(w1_args "$parity_steps") --ckpt-dir "$resumed" --resume --ckpt-async
  local trained resume ok=false
  trained=$(loss_rel w1_ckpt_async parity_cuda_w1 1e-5)
  resume=$(jq -cn --argjson a "$(figure "$logs/w1_ckpt_resumed.json" final_loss)" --argjson b "$(figure "$a" final_loss)" \
             --argjson from "$(jq -c '.resumed_from // null' "$logs/w1_ckpt_resumed.json" 2>/dev/null || echo null)" \
             '{resumed_from: $from, final_loss: $a, uninterrupted: $b,
               final_rel: (if $a == null or $b == null then null else (($a - $b) | fabs) / ($b | fabs) end)}')
  jq -e --argjson t "$trained" '.final_rel != null and .final_rel <= 1e-5 and $t.within' <<<"$resume" > /dev/null &&
    jq -e '.checkpoint.async == true and .checkpoint.saves >= 2 and .checkpoint.published == .checkpoint.saves
          and .checkpoint.staged_bytes > 0' \
      "$a" > /dev/null && ok=true
  emit ckpt_async "$ok" checkpoint "$(jq -c '.checkpoint // null' "$a")" vs_cuda_w1 "$trained" resumed "$resume" tol 1e-5
}
# nvme_offload: parameters and optimizer state on disk, each unit stepped
# (on the host) as its gradient arrives in backward, against the same run
# in memory (stepped on the device: within parity's GPU/CPU tolerance).
check_nvme_offload() {
  local dir; dir="$(scratch)/nvme"; rm -rf "$dir"; mkdir -p "$dir"
  # shellcheck disable=SC2046
  train w1_clip0 1 $(w1_args "$parity_steps") --clip-grad-norm 0
  # shellcheck disable=SC2046
  train w1_nvme 1 $(w1_args "$parity_steps") --clip-grad-norm 0 --offload-optimizer nvme --offload-params nvme \
    --offload-dir "$dir"
  local a="$logs/w1_nvme.json"
  [ -s "$a" ] || { emit nvme_offload false error "$(tail_of "$logs/w1_nvme.log" 12)"; return; }
  local diff ok=false
  diff=$(loss_rel w1_nvme w1_clip0 1e-4)
  jq -e '.within' <<<"$diff" > /dev/null && ok=true
  emit nvme_offload "$ok" vs_in_memory "$diff" \
    bit_identical "$( [ "$(jq -r .loss "$logs/w1_nvme.jsonl" 2>/dev/null)" = "$(jq -r .loss "$logs/w1_clip0.jsonl" 2>/dev/null)" ] && echo true || echo false)" \
    offload_engine "$(jq -c '.offload_engine // null' "$a")" read_bytes_per_step "$(figure "$a" offload_read_bytes_per_step)" \
    written_bytes_per_step "$(figure "$a" offload_written_bytes_per_step)" offload_wait_s "$(figure "$a" offload_wait_s)"
}
# sdpa: fused attention (at::scaled_dot_product_attention) against the
# written-out path, within 1e-4. Without --attention, or on a LibTorch
# before 2.0 (which has no such kernel: the dry run on Debian's 1.13), there
# is nothing to compare: "ok": null says so, and is not a failure. (The help
# is read whole first: `--help | grep -q` under pipefail failed or passed as
# grep's early exit raced the writer's last write.)
check_sdpa() {
  local help
  help=$(timeout -k 5 "$(limit 30)" "$build/fsdp-train" --help 2>/dev/null)
  if ! grep -q -- '--attention' <<<"$help"; then
    emit sdpa null pending '"fsdp-train has no --attention flag yet (fused attention is being added): nothing compared"'
    return
  fi
  # shellcheck disable=SC2046
  train w1_attention_written 1 $(w1_args "$parity_steps") --attention written
  local libtorch
  libtorch=$(jq -r '.libtorch // ""' "$logs/w1_attention_written.json" 2>/dev/null)
  if [ "${libtorch%%.*}" = 1 ]; then
    emit sdpa null pending "$(str "LibTorch $libtorch has no scaled_dot_product_attention: nothing compared")"
    return
  fi
  # shellcheck disable=SC2046
  train w1_attention_sdpa 1 $(w1_args "$parity_steps") --attention sdpa
  local diff ok=false
  diff=$(loss_rel w1_attention_sdpa w1_attention_written 1e-4)
  jq -e '.within' <<<"$diff" > /dev/null && ok=true
  local tails=null
  [ "$ok" = true ] || tails=$(jq -cn --argjson w "$(tail_of "$logs/w1_attention_written.log" 4)" \
                                --argjson s "$(tail_of "$logs/w1_attention_sdpa.log" 4)" '{written: $w, sdpa: $s}')
  emit sdpa "$ok" vs_written "$diff" logs "$tails"
}
# lora: rank-8 adapters on every linear; the loss falls, and the base
# weights saved after training are byte for byte those saved before it.
lora_cmp_py='
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
base = [k for k in a if "lora_" not in k]
print(json.dumps({"base_tensors": len(base), "base_changed": sorted(k for k in base if a[k] != b.get(k))[:5],
                  "adapters_changed": sum(1 for k in a if "lora_" in k and a[k] != b.get(k))}))
'
check_lora() {
  local before after lora=(--lora-rank 8 --lora-targets all-linear)
  before="$(scratch)/lora_before.safetensors"; after="$(scratch)/lora_after.safetensors"; rm -f "$before" "$after"
  # shellcheck disable=SC2046
  train w1_lora_before 1 $(w1_args 0) "${lora[@]}" --save-final "$before"
  # shellcheck disable=SC2046
  train w1_lora 1 $(w1_args "$parity_steps") "${lora[@]}" --save-final "$after"
  local a="$logs/w1_lora.json"
  [ -s "$a" ] && [ -s "$before" ] && [ -s "$after" ] ||
    { emit lora false error "$(tail_of "$logs/w1_lora.log" 8)" before "$(tail_of "$logs/w1_lora_before.log" 4)"; return; }
  local first last weights ok=false
  first=$(jq -s '.[0].loss // null' "$logs/w1_lora.jsonl"); last=$(figure "$a" final_loss)
  weights=$(with_caller_libs timeout -k 5 "$(limit 60)" "$python" -c "$lora_cmp_py" "$before" "$after" 2>"$logs/lora_cmp.log") ||
    weights=$(jq -cn --argjson e "$(tail_of "$logs/lora_cmp.log" 4)" '{error: $e}')
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(f != "null" && l != "null" && l < f) }' &&
    jq -e '.base_tensors > 0 and (.base_changed | length) == 0 and .adapters_changed > 0' <<<"$weights" > /dev/null && ok=true
  emit lora "$ok" first_loss "$first" final_loss "$last" trainable_parameters "$(figure "$a" trainable_parameters)" \
    parameters "$(figure "$a" parameters)" weights "$weights"
}

# planned_order: the checks' names in main's order (one per run of lines:
# a shape's bench and bench_vs_fsdp2 each), as the dry run's done line
# lists them; tests/trainer/cases/gpu-check.sh holds main to it.
planned_order() {
  local first="${bench_shapes%% *}" shape order="env prefix gpu nccl_torch configure build nccl parity_w1"
  [ -z "$first" ] || order+=" bench bench_vs_fsdp2"
  order+=" zeropp ckpt_async nvme_offload sdpa lora"
  for shape in ${bench_shapes#"$first"}; do order+=" bench bench_vs_fsdp2"; done
  echo "$order offload_run offload parity_w2_w4 tests done"
}

# finish [WHY]: the done line (WHY: the script stopped early, and why), the
# logs, and the exit status: 0 only where every check passed.
finish() {
  [ -z "${1:-}" ] || stopped="$1"
  emit "done" "$( [ ${#failed[@]} -eq 0 ] && [ -z "$stopped" ] && echo true || echo false)" \
    dry_run "$( [ $dry = 1 ] && echo true || echo false)" launch "$(str "$launch")" \
    order "$( [ $dry = 1 ] && planned_order | jq -Rc 'split(" ")' || echo null)" \
    stopped "$( [ -n "$stopped" ] && str "$stopped" || echo null)" \
    failed "$(printf '%s\n' "${failed[@]}" | jq -Rsc 'split("\n") | map(select(length > 0))' 2>/dev/null || echo '[]')" \
    seconds "$(elapsed)"
  save_logs
  [ ${#failed[@]} -eq 0 ] && [ -z "$stopped" ]
  exit $?
}

# main: the checks in their order (the header's list). Each attempt names
# the least time the check could do with; the rest is its commands' limits.
main() {
  check_env
  check_prefix
  [ "$launch" != none ] || finish "the prefix's MPI does not start (see the prefix line): nothing fsdp-cpp builds could run"
  if [ $dry = 1 ]; then
    check_configure || finish "configure failed"
    [ -z "${FSDP_GPU_CHECK_TARGET:-}" ] || check_build "$FSDP_GPU_CHECK_TARGET"
    finish
  fi
  if [ "$device" = cuda ]; then
    attempt gpu 10 check_gpu
  else
    skip gpu "FSDP_GPU_CHECK_DEVICE=$device: no GPU is looked for"
  fi
  attempt nccl_torch 20 check_nccl_torch
  attempt configure 30 check_configure || finish "configure did not succeed: nothing to build"
  attempt build 60 check_build fsdp-train fsdp-cma-probe test_devices
  if [ ! -x "$build/fsdp-train" ] || [ ! -x "$build/fsdp-run" ]; then
    local c
    for c in nccl parity_w1 bench offload parity_w2_w4 tests; do skip "$c" "no $build/fsdp-train or fsdp-run: the build failed"; done
    finish
  fi
  if [ -x "$(test_devices)" ]; then attempt nccl 10 check_nccl; else skip nccl "no $(test_devices): the build failed"; fi
  attempt parity_w1 30 check_parity_w1
  local shape first="${bench_shapes%% *}"  # the first shape right after parity_w1, then issue 42's checks, then the others
  attempt "bench_$first" 60 check_bench "$first"
  attempt zeropp 20 check_zeropp
  attempt ckpt_async 30 check_ckpt_async
  attempt nvme_offload 30 check_nvme_offload
  attempt sdpa 20 check_sdpa
  attempt lora 30 check_lora
  for shape in ${bench_shapes#"$first"}; do attempt "bench_$shape" 60 check_bench "$shape"; done
  attempt offload 60 check_offload
  if [ "$launch" = mpirun ]; then
    attempt parity_w2_w4 60 check_parity_w2_w4
    attempt tests 30 check_tests
  else
    skip parity_w2_w4 "mpirun -n 2 failed in the prefix check: runs of 2 and 4 ranks cannot start"
    skip tests "mpirun -n 2 failed in the prefix check: the gpu tests start through fsdp-run (mpirun)"
  fi
  finish
}

# Sourced (bash -c '. scripts/gpu_check.sh'), it only defines the checks: a
# test can run one alone, or main in a subshell.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
main
