#!/usr/bin/env bash
# On a machine with a GPU (the device tool's H200: PyTorch as python3, cmake,
# ninja, nvcc, NCCL; no MPI, no network): builds fsdp-cpp and runs its GPU
# checks in at most 8 minutes, one JSON line per check on stdout and in
# $OUT/gpu_check.jsonl ($OUT unset: build-gpu/gpu_check.jsonl); each line is
# {"check": NAME, "ok": true|false, figures...}. A failing check does not stop
# the ones after it. Run from anywhere, as one command:
#
#   bash scripts/gpu_carry.sh                 # here, once: fills .gpu-carry/
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=560)
#   bash scripts/gpu_check.sh --dry-run       # no GPU: unpack, configure, stop
#
# Checks, in this order (the figures first, so that a slow build costs the
# least important ones): prefix (OpenMPI from .gpu-carry/ works), gpu
# (nvidia-smi), configure, build (only what the checks run), bench (bf16,
# fsdp-cpp full_shard against PyTorch FSDP2 fully_shard at W=1, on the large
# preset and on GPT-2-124M: tokens/s, peak device memory, MFU), offload
# (--offload cpu against none), parity (fp32 losses: W=1/2/4 ranks on the
# one GPU, and GPU against CPU), tests (ctest -L gpu, but trainer_gpu, whose
# runs parity and offload repeat), done. Logs and summaries go to
# $OUT/gpu_logs.tar.gz, rewritten after every check.
#
# Settings (environment): FSDP_LIBTORCH (default: python3's torch folder),
# FSDP_PYTHON (python3), FSDP_GPU_BUILD (build-gpu), FSDP_GPU_PREFIX
# (/tmp/gpu-prefix), FSDP_GPU_CHECK_NO_GPU=1 (as --dry-run),
# FSDP_GPU_CHECK_TARGET (--dry-run: also build this one target),
# FSDP_GPU_CHECK_JOBS (build jobs, default all cores), FSDP_GPU_CMAKE_ARGS
# (more cmake arguments), FSDP_GPU_BENCH_STEPS (15), FSDP_GPU_BENCH_BATCH (16),
# FSDP_GPU_CHECK_BUDGET (seconds after which no further check starts: 400),
# FSDP_GPU_CHECK_DEADLINE (seconds by which every command has ended, its
# time limit cut to what is left: 470, inside the 8 minutes),
# FSDP_GPU_OFFLOAD_BATCH (the offload pair's sequences: 4; the bench's
# batch is mostly activations, which offload does not move), FSDP_GPU_BENCH_SHAPES (large
# gpt2_124m), FSDP_GPU_PARITY_PRESET (small), FSDP_GPU_PARITY_STEPS (20),
# FSDP_GPU_CHECK_LOGS ($FSDP_GPU_BUILD/gpu-logs), FSDP_GPU_CHECK_DEVICE
# (cuda; cpu runs the checks' own logic without a GPU, with the tiny shape:
# tests/trainer/gpu-check.sh does, sourcing this script).
set -uo pipefail
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
jobs="${FSDP_GPU_CHECK_JOBS:-$(nproc)}"
budget="${FSDP_GPU_CHECK_BUDGET:-400}"
deadline="${FSDP_GPU_CHECK_DEADLINE:-470}"
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
peak_flops=989e12  # H200 SXM dense bf16, the vendor's figure (KINDS.md measured ~790e12 on random data)
logs="${FSDP_GPU_CHECK_LOGS:-$build/gpu-logs}"
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"
jsonl="${OUT:+$OUT/gpu_check.jsonl}"
jsonl="${jsonl:-$build/gpu_check.jsonl}"
: > "$jsonl"
start=$EPOCHREALTIME
failed=()

# elapsed: whole seconds since the script started.
elapsed() { local now=$EPOCHREALTIME; echo $(( ${now%.*} - ${start%.*} )); }
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
  [ "$ok" = true ] || [[ " ${failed[*]} " == *" $check "* ]] || failed+=("$check")
  echo "$line" | tee -a "$jsonl"
  save_logs
}
str() { jq -cn --arg s "$1" '$s'; }                        # a shell string as JSON
tail_of() { str "$(tail -n "${2:-15}" "$1" 2>/dev/null)"; } # a log's last lines as JSON
over_budget() { [ "$(elapsed)" -ge "$budget" ]; }
# limit SECONDS: SECONDS, or less where the deadline is nearer (at least 1).
limit() { local left=$(( deadline - $(elapsed) )); [ "$left" -ge 1 ] || left=1; echo $(( $1 < left ? $1 : left )); }
# The logs so far, in one file ($OUT brings back 8 files at most): after
# every check, so that a run cut short still brings its logs back.
save_logs() { [ -z "${OUT:-}" ] || tar -czf "$OUT/gpu_logs.tar.gz" -C "$logs" . 2>/dev/null || true; }
# skip CHECK: the check is not run, and says why.
skip() { emit "$1" false skipped "$(str "$2")"; }

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
check_prefix() {
  local t0=$EPOCHREALTIME log="$logs/prefix.log" why
  pruned=()
  unpack_prefix > "$logs/unpack.log" 2>&1  # not in $(...): it sets pruned
  local rc=$?
  why=$(tail -5 "$logs/unpack.log")
  prefix_env
  if [ $rc -ne 0 ] || ! jq -n 1 >/dev/null 2>&1; then
    echo "{\"check\":\"prefix\",\"ok\":false,\"error\":$(printf '%s' "${why:-jq not found in the prefix}" | python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))' 2>/dev/null || echo '"unpacking failed"')}" | tee -a "$jsonl"
    failed+=(prefix); return 1
  fi
  # An MPI program built with the prefix's mpicxx, started both ways
  # fsdp-cpp's are: as mpirun's ranks, and as a singleton (started without
  # mpirun, it starts orted from the prefix itself).
  printf '%s\n' '#include <mpi.h>' '#include <cstdio>' \
    'int main(int c, char** v) { MPI_Init(&c, &v); int r, n, x, s = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r);' \
    '  MPI_Comm_size(MPI_COMM_WORLD, &n); x = r + 1; MPI_Allreduce(&x, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);' \
    '  std::printf("rank %d of %d: sum %d\n", r, n, s); MPI_Finalize(); return s != n * (n + 1) / 2; }' > "$logs/mpi_hello.cpp"
  { mpicxx -o "$logs/mpi_hello" "$logs/mpi_hello.cpp" &&
    timeout 60 mpirun --allow-run-as-root --oversubscribe -n 2 "$logs/mpi_hello"; } > "$log" 2>&1
  local mpirun_rc=$?
  timeout 60 "$logs/mpi_hello" >> "$log" 2>&1
  local singleton_rc=$?
  local version; version=$(ompi_info --version 2>/dev/null | head -1)
  local ok=false; [ $mpirun_rc -eq 0 ] && [ $singleton_rc -eq 0 ] && ok=true
  emit prefix "$ok" prefix "$(str "$prefix")" openmpi "$(str "$version")" packages "$(ls .gpu-carry/*.deb | wc -l)" \
    pruned "$(printf '%s\n' "${pruned[@]}" | jq -Rsc 'split("\n") | map(select(length > 0))')" \
    mpirun_rc "$mpirun_rc" singleton_rc "$singleton_rc" log "$(tail_of "$log" 6)" \
    os "$(str "$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}") / glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')")" \
    seconds "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
}

# ---- the GPU itself.
check_gpu() {
  local q
  if ! q=$(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,compute_mode \
             --format=csv,noheader,nounits 2>&1); then
    emit gpu false error "$(str "nvidia-smi failed or is missing: $q")"; return
  fi
  IFS=, read -r name mem driver cc mode <<<"$(head -1 <<<"$q")"
  # Ranks sharing the GPU (parity's W = 2, 4) need the Default compute mode.
  emit gpu true name "$(str "${name# }")" memory_mib "${mem// /}" driver "$(str "${driver// /}")" \
    compute_capability "$(str "${cc// /}")" compute_mode "$(str "${mode// /}")" count "$(wc -l <<<"$q")" \
    torch "$(str "$(env -u LD_LIBRARY_PATH "$python" -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>&1 | tail -1)")"
}

# ---- configure and build.
libtorch="${FSDP_LIBTORCH:-$(env -u LD_LIBRARY_PATH "$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)}"
check_configure() {
  local log="$logs/configure.log" t0=$EPOCHREALTIME
  if [ -z "$libtorch" ]; then
    emit configure false error "$(str "expected FSDP_LIBTORCH or a $python that imports torch; found neither")"; return 1
  fi
  # Only Hopper's code (sm_90) is compiled: the build is the slow part.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  # shellcheck disable=SC2086
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSDP_LIBTORCH="$libtorch" \
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
    seconds "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    log "$( [ "$ok" = true ] && str "" || tail_of "$log" 25)"
  [ "$ok" = true ]
}
# check_build TARGET...: the checks' targets (the trainer, the launcher's
# probe and the GPU tests' binary), not the whole tree.
check_build() {
  local log="$logs/build.log" t0=$EPOCHREALTIME
  # -k 0: one target that fails to compile does not keep the others (the
  # trainer, say) from being built and checked.
  timeout "$(limit 360)" cmake --build "$build" -j "$jobs" --target "$@" -- -k 0 > "$log" 2>&1
  local rc=$? ok=false; [ $rc -eq 0 ] && ok=true
  emit build "$ok" target "$(str "$*")" jobs "$jobs" rc "$rc" \
    seconds "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    log "$( [ "$ok" = true ] && str "" || grep -E -m 12 -B2 -A4 'error|FAILED' "$log" | tail -40 | jq -Rs .)"
}

# ---- the GPU tests: ctest's label gpu (each exits 77, ctest's "skipped",
# without a GPU: on this machine a skip is a failure), but trainer_gpu: its
# runs are the parity and offload checks' again.
check_tests() {
  local log="$logs/ctest-gpu.log"
  timeout "$(limit 260)" ctest --test-dir "$build" -L gpu -E '^trainer_gpu$' --output-on-failure > "$log" 2>&1
  local rc=$?
  # ctest's lines: "1/3 Test #4: NAME ....   Passed  1.2 sec" (or ***Failed, ***Skipped, ***Not Run, ...).
  local results; results=$(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?(Not Run|[A-Za-z]+).*/\1 \3/p' "$log")
  local total passed skipped
  total=$(grep -c . <<<"$results"); passed=$(grep -c ' Passed$' <<<"$results"); skipped=$(grep -c ' Skipped$' <<<"$results")
  [ -n "$results" ] || total=0
  local ok=false; [ $rc -eq 0 ] && [ "$total" -gt 0 ] && [ "$skipped" -eq 0 ] && ok=true
  emit tests "$ok" label '"gpu"' total "$total" passed "$passed" skipped "$skipped" rc "$rc" \
    not_passed "$(grep -v ' Passed$' <<<"$results" | jq -Rsc 'split("\n") | map(select(length > 0))')" \
    log "$( [ "$ok" = true ] && str "" || tail_of "$log" 30)"
}

# train NAME RANKS ARGS...: fsdp-train through fsdp-run, its summary in
# $logs/NAME.json and per-step log in $logs/NAME.jsonl; the status is fsdp-run's.
train() {
  local name="$1" ranks="$2"; shift 2
  rm -f "$logs/$name.json" "$logs/$name.jsonl"
  timeout -k 10 "$(limit 150)" "$build/fsdp-run" -n "$ranks" -- "$build/fsdp-train" "$@" \
    --summary "$logs/$name.json" --log "$logs/$name.jsonl" > "$logs/$name.log" 2>&1
}
# figure FILE KEY: a summary's number (the largest, where it is per rank).
figure() { jq -c --arg k "$2" '.[$k] | if type == "array" then max else . end // null' "$1" 2>/dev/null || echo null; }
# ratio A B: A / B to 3 decimals, or null where either is not a positive number.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "null" }'; }
reldiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; printf "%.3g", (m > 0 ? d / m : d) }'; }

# ---- parity, fp32: the small preset, global batch 8 as W ranks x 8/W on the
# one GPU (W = 2, 4 over MPI's host-staged collectives: NCCL refuses two ranks
# on one device), and on the CPU.
check_parity() {
  local common=(--preset "$parity_preset" --steps "$parity_steps" --strategy full_shard --param-dtype fp32
                --print-every "$parity_steps")
  local runs=("cuda_w1 1 --device $device --batch 8" "cuda_w2 2 --device $device --backend mpi --batch 4"
              "cuda_w4 4 --device $device --backend mpi --batch 2" "cpu_w1 1 --device cpu --batch 8")
  local r name ranks args finals="{}" errors="{}"
  for r in "${runs[@]}"; do
    read -r name ranks args <<<"$r"
    # shellcheck disable=SC2086
    if train "parity_$name" "$ranks" "${common[@]}" $args; then
      finals=$(jq -c --arg n "$name" --argjson v "$(figure "$logs/parity_$name.json" final_loss)" '. + {($n): $v}' <<<"$finals")
    else
      errors=$(jq -c --arg n "$name" --argjson v "$(tail_of "$logs/parity_$name.log" 8)" '. + {($n): $v}' <<<"$errors")
    fi
  done
  # Relative differences of the final losses, and the largest over all 20
  # steps (the logs' .loss), against cuda_w1.
  local diffs="{}" ok=true ref; ref=$(jq -r '.cuda_w1 // empty' <<<"$finals")
  for name in cuda_w2 cuda_w4 cpu_w1; do
    local v tol=1e-5; [ "$name" = cpu_w1 ] && tol=1e-4
    v=$(jq -r --arg n "$name" '.[$n] // empty' <<<"$finals")
    if [ -z "$ref" ] || [ -z "$v" ] || [ "$v" = null ]; then ok=false; continue; fi
    local final steps
    final=$(reldiff "$v" "$ref")
    steps=$(paste <(jq -r .loss "$logs/parity_$name.jsonl" 2>/dev/null) <(jq -r .loss "$logs/parity_cuda_w1.jsonl" 2>/dev/null) |
            awk '{ d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; r = m > 0 ? d / m : d; if (r > x) x = r; n++ }
                 END { if (n) printf "%.3g", x; else print "null" }')
    diffs=$(jq -c --arg n "$name" --argjson f "$final" --argjson s "$steps" --argjson t "$tol" \
            '. + {($n): {final_rel: $f, max_step_rel: $s, tol: $t}}' <<<"$diffs")
    awk -v d="$final" -v t="$tol" 'BEGIN { exit !(d <= t) }' || ok=false
  done
  emit parity "$ok" device "$(str "$device")" preset "$(str "$parity_preset")" steps "$parity_steps" \
    final_loss "$finals" vs_cuda_w1 "$diffs" errors "$errors"
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
bench_ours() {  # NAME SHAPE [MORE ARGS]: fsdp-train bf16 full_shard at W=1
  local name="$1" shape="$2"; shift 2
  # shellcheck disable=SC2046
  train "$name" 1 $(shape_args "$shape") --batch "$bench_batch" --steps "$bench_steps" --print-every "$bench_steps" \
    --device "$device" --param-dtype bf16 --reduce-dtype fp32 --strategy full_shard "$@"
}
bench_peer() {  # NAME SHAPE: PyTorch FSDP2 at W=1 (a 1-rank NCCL group, no torchrun)
  local name="$1" shape="$2"
  rm -f "$logs/$name.json"
  # shellcheck disable=SC2046
  env -u LD_LIBRARY_PATH timeout -k 10 "$(limit 150)" "$python" bench/peer.py --engine fsdp2 --device "$device" --dtype bf16 \
    $(shape_args "$shape") --batch "$bench_batch" --steps "$bench_steps" --summary "$logs/$name.json" > "$logs/$name.log" 2>&1
}
check_bench() {
  local shape
  for shape in $bench_shapes; do
    if over_budget; then skip "bench_$shape" "over the time budget (${budget} s)"; continue; fi
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
  done
}

# ---- offload: the first shape's (large's) bf16 run with --offload cpu
# against the same run without, at FSDP_GPU_OFFLOAD_BATCH sequences (goal:
# peak device memory at most 0.35 x). At the bench's 16 activations
# outweigh the model state (fsdp-plan: 0.45 x at 16, 0.20 x at 4), and
# offload moves only the model state.
check_offload() {
  local shape="${bench_shapes%% *}" b="$logs/bench_fsdp_cpp_${shape}_b$offload_batch.json"
  local a="$logs/bench_fsdp_cpp_${shape}_b${offload_batch}_offload.json"
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

finish() {
  emit "done" "$( [ ${#failed[@]} -eq 0 ] && echo true || echo false)" dry_run "$( [ $dry = 1 ] && echo true || echo false)" \
    failed "$(printf '%s\n' "${failed[@]}" | jq -Rsc 'split("\n") | map(select(length > 0))')" seconds "$(elapsed)"
  save_logs
  [ ${#failed[@]} -eq 0 ]
  exit $?
}

# Sourced (bash -c '. scripts/gpu_check.sh'), it only defines the checks: a test can run one alone.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
check_prefix || finish
[ $dry = 1 ] || check_gpu
if ! check_configure; then finish; fi
targets=(fsdp-train fsdp-cma-probe test_devices)
if [ $dry = 1 ]; then
  [ -z "${FSDP_GPU_CHECK_TARGET:-}" ] || check_build "$FSDP_GPU_CHECK_TARGET"
  finish
fi
check_build "${targets[@]}"
if [ ! -x "$build/fsdp-train" ] || [ ! -x "$build/fsdp-run" ]; then
  for c in bench offload parity tests; do skip "$c" "no $build/fsdp-train or fsdp-run: the build failed"; done
  finish
fi
check_bench
if over_budget; then skip offload "over the time budget (${budget} s)"; else check_offload; fi
if over_budget; then skip parity "over the time budget (${budget} s)"; else check_parity; fi
if over_budget; then skip tests "over the time budget (${budget} s)"; else check_tests; fi
finish
