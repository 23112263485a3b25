# Checkpoints written by an earlier fsdp-cpp resume bit-exactly: the fixtures
# in tests/fixtures/checkpoint-04d839d/ were saved at step 3 of 6 by commit
# 04d839d (the trainer before it became a program over the library's
# checkpoint manager); resuming them must give, to the last bit, the losses
# of steps 4-6 that 04d839d itself gave resuming them with this LibTorch
# (losses-libtorch-<version>.jsonl beside each fixture).
fixtures="$here/../fixtures/checkpoint-04d839d"
# The flags each fixture was trained with (its README says so too).
declare -A flags=(
  [sharded]="--lr-schedule cosine --warmup-steps 2 --weight-decay 0.1"
  [full]="--ckpt-format full --param-dtype bf16 --reduce-dtype fp16"
)
# The CPU's bf16 kernels: oneDNN takes AMX where the CPU has it, else
# AVX-512 BF16, and they round bf16 matmuls differently, so the bf16
# fixture's losses are per kind of CPU (losses-libtorch-<v>-<isa>.jsonl,
# where 04d839d was run on one; the file without a suffix is the machine's
# that wrote the fixtures).
cpu_bf16_isa() {
  if grep -qw amx_bf16 /proc/cpuinfo; then echo amx
  elif grep -qw avx512_bf16 /proc/cpuinfo; then echo avx512bf16
  else echo none; fi
}
# And the fp32 matrix products: Debian's LibTorch runs OpenBLAS, whose kernel
# is the one it picks for this CPU (OpenBLAS 0.3.21 takes its generic
# Prescott kernels on a CPU it does not know, such as an Emerald Rapids Xeon,
# model 207, which rounds otherwise than its Haswell, Zen or Sapphire Rapids
# ones); the wheel's runs MKL. Files for a kind are named
# losses-libtorch-<v>-<isa>-<blas>.jsonl.
blas_kernel() {
  if [ -n "$(sed -n 's/^FSDP_LIBTORCH:PATH=//p' "$build/CMakeCache.txt")" ]; then echo mkl; return; fi
  python3 -c 'import ctypes
blas = ctypes.CDLL("libblas.so.3")
blas.openblas_get_corename.restype = ctypes.c_char_p
print(blas.openblas_get_corename().decode().lower())' 2>/dev/null || echo unknown
}
for fixture in sharded full; do
  mkdir -p "$work/$fixture"
  cp -r "$fixtures/$fixture/step-3" "$work/$fixture/"
  # --attention written: 04d839d wrote its attention out (the fused kernel of
  # LibTorch 2.x, the default there now, rounds otherwise in the last bits).
  # shellcheck disable=SC2086
  train_run "$fixture" 2 --preset tiny --steps 6 --ckpt-dir "$work/$fixture" --ckpt-every 3 --resume --attention written ${flags[$fixture]}
  version=$(jq -r .libtorch "$work/$fixture.json")
  for expected in "$fixtures/$fixture/losses-libtorch-$version-$(cpu_bf16_isa)-$(blas_kernel).jsonl" \
                  "$fixtures/$fixture/losses-libtorch-$version-$(cpu_bf16_isa).jsonl" \
                  "$fixtures/$fixture/losses-libtorch-$version.jsonl"; do
    [ ! -f "$expected" ] || break
  done
  [ -f "$expected" ] || fail "no losses recorded for LibTorch $version in $fixtures/$fixture (add them from a run of 04d839d)"
  [ "$(jq -r .first_step "$work/$fixture.json")" = 3 ] || fail "$fixture: did not resume at step 3"
  jq -c '[.step,.loss]' "$work/$fixture.jsonl" > "$work/$fixture.losses"
  diff "$expected" "$work/$fixture.losses" ||
    fail "$fixture: the resumed losses differ from 04d839d's in $(basename "$expected") (this CPU: bf16 $(cpu_bf16_isa), BLAS kernel $(blas_kernel); a kind of CPU that rounds otherwise needs 04d839d's own losses there: tests/fixtures/checkpoint-04d839d/README.md)"
  echo "ok: $fixture checkpoint of 04d839d resumed; steps 4-6 equal its run's bit for bit (LibTorch $version, $(basename "$expected"))"
done
