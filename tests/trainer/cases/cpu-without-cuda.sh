# A CPU run maps no CUDA library. In the CUDA configuration (a PyPI wheel's
# LibTorch), the tools link LibTorch's CPU libraries alone, and what needs
# CUDA is the module libfsdp_cuda.so, loaded when a run asks for a GPU
# (src/comm/cuda_module.h): here, a running rank's /proc/PID/maps holds
# libtorch_cpu and none of libtorch_cuda, libc10_cuda, libnccl, libcuda, nor
# libcudart unless libtorch_cpu itself needs it (the wheel's does). The module is built, needs only what the program exports, and
# loads on a machine without a GPU; --device cuda without one is refused as
# before; a module that is missing is named with where the loader looked.
# In a build without CUDA (Debian's LibTorch), the same maps check, trivially.
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
cuda_libraries='libtorch_cuda|libc10_cuda|libcudart|libnccl|libcuda\.so|libcublas|libcudnn'

# The programs need no CUDA library.
for tool in fsdp-train fsdp-plan fsdp-ckpt; do
  needed=$(readelf -d "$build/$tool" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  grep -q '^libtorch_cpu\.so\|^libtorch\.so' <<<"$needed" || fail "$tool links no libtorch_cpu: readelf read something else? $needed"
  ! grep -Eq "$cuda_libraries" <<<"$needed" || fail "$tool needs a CUDA library: $(grep -E "$cuda_libraries" <<<"$needed" | tr '\n' ' ')"
done
echo "ok: fsdp-train, fsdp-plan and fsdp-ckpt need no CUDA library"

# A running CPU rank maps none. FSDP_CUDA_MODULE names a module that does not
# exist: were anything to try loading it, the run would fail.
log="$work/maps.jsonl"
FSDP_CUDA_MODULE=/nonexistent/libfsdp_cuda.so "$run" -n 2 -- "$train" --preset tiny --steps 100000 --log "$log" \
  > "$work/maps.out" 2>&1 &
pid=$!
for i in $(seq 600); do
  [ "$(grep -c '"step"' "$log" 2>/dev/null)" -ge 3 ] 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/maps.out"; fail "the CPU run ended before step 3"; }
  sleep 0.1
done
ranks=$(pgrep -f -- "--log $log") || { kill -TERM "$pid"; fail "no rank of the CPU run found"; }
maps="" trainers=""  # the launcher's and mpirun's command lines match too
for rank in $ranks; do
  [ "$(readlink "/proc/$rank/exe")" = "$(readlink -f "$train")" ] || continue
  maps+=$(cat "/proc/$rank/maps")$'\n' trainers+=" $rank"
done
kill -TERM "$pid"
wait "$pid" || true  # 76: stopped at a step boundary, without --ckpt-dir
torch_cpu=$(grep -Eo '/[^ ]*/libtorch_cpu\.so' <<<"$maps" | head -1)
[ -n "$torch_cpu" ] || fail "no rank's maps hold libtorch_cpu: were they read? (processes $(echo $ranks), ranks$trainers)"
# The wheel's libtorch_cpu itself needs the CUDA runtime and CUPTI (its
# profiler's), about 7 MiB of files: those come with LibTorch's CPU half and
# are allowed; nothing else of CUDA's is.
own=$(readelf -d "$torch_cpu" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -E 'cuda|cupti' | tr '\n' ' ')
mapped=$(grep -Eo "[^/ ]*($cuda_libraries)[^ ]*" <<<"$maps" | sort -u | grep -vxF -f <(tr ' ' '\n' <<<"$own" | grep .) |
         tr '\n' ' ')
[ -z "$mapped" ] || fail "a CPU rank maps CUDA libraries: $mapped"
echo "ok: CPU ranks ($(echo $trainers)) map libtorch_cpu and no CUDA library${own:+ but what libtorch_cpu itself needs: $own}"

if [ "$(cache FSDP_CUDA)" != ON ]; then
  echo "a build without CUDA: no module to check"
  exit 0
fi

# The module: built beside the tools, linking LibTorch's CUDA half, and every
# fsdp symbol it needs is one fsdp-train exports (one copy of each class).
module="$build/libfsdp_cuda.so"
[ -f "$module" ] || fail "the CUDA configuration built no $module"
readelf -d "$module" | grep 'NEEDED.*\[libtorch_cuda\.so\]' > /dev/null || fail "$module does not need libtorch_cuda.so"
exported=$(nm -D --defined-only "$train" | awk '{print $3}' | sort -u)
missing=$(nm -u "$module" | awk '{print $2}' | grep '4fsdp' | sort -u | comm -23 - <(echo "$exported"))
[ -z "$missing" ] || fail "fsdp-train does not export what the module needs: $(c++filt <<<"$missing" | tr '\n' ';')"
echo "ok: the module needs libtorch_cuda, and fsdp-train exports the $(nm -u "$module" | grep -c '4fsdp') fsdp symbols it uses"

if [ -e /dev/nvidiactl ] || [ -e /dev/dxg ]; then
  echo "an NVIDIA driver is here: the refusals without a GPU are not checked (the gpu case runs --device cuda)"
  exit 0
fi
common=(--preset tiny --steps 1)
# Without a driver --device cuda is refused as before, the module not loaded...
expect_error "this process sees no GPU (CUDA_VISIBLE_DEVICES, the driver?)" "$run" -n 1 -- "$train" "${common[@]}" --device cuda
# ...and loaded, when FSDP_CUDA_MODULE names it, it counts no GPU: refused the same way, no crash.
FSDP_CUDA_MODULE="$module" expect_error "this process sees no GPU (CUDA_VISIBLE_DEVICES, the driver?)" \
  "$run" -n 1 -- "$train" "${common[@]}" --device cuda
# A module that is not there is named, with where the loader looked.
FSDP_CUDA_MODULE="$work/none/libfsdp_cuda.so" expect_error "looked at:
  $work/none/libfsdp_cuda.so: absent" "$run" -n 1 -- "$train" "${common[@]}" --device cuda
# The module loads in a test program too (the GPU tests' main counts GPUs first: none here, so it skips).
if [ -x "$build/tests/test_devices" ]; then
  out=$(FSDP_TEST_NEEDS_GPU=1 FSDP_CUDA_MODULE="$module" "$run" -n 1 -- "$build/tests/test_devices" 2>&1); rc=$?
  [ "$rc" -eq 77 ] && grep -q "skipped: no GPU visible" <<<"$out" || fail "test_devices with the module: status $rc: $out"
  echo "ok: test_devices loads the module without a GPU and skips"
fi
