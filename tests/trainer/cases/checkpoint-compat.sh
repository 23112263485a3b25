# Checkpoints written by an earlier fsdp-cpp resume bit-exactly: the fixtures
# in tests/fixtures/checkpoint-04d839d/ were saved at step 3 of 6 by commit
# 04d839d (the trainer before it became a program over the library's
# checkpoint manager), and those in checkpoint-dd8c28a-frozen/ (frozen
# parameters and LoRA) at step 3 of 5 by dd8c28a (before a unit owned its
# frozen buffer); resuming them must give, to the last bit, the losses that
# commit itself gave resuming them with this LibTorch
# (losses-libtorch-<version>.jsonl beside each fixture).
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
# oneDNN capped below AVX-512 BF16 (ONEDNN_MAX_CPU_ISA, as an AVX2-only CPU
# is emulated on a newer one) has no bf16 instructions either: LibTorch 2.x
# then asks oneDNN for no bf16 product and emulates them, as on such a CPU.
cpu_bf16_isa() {
  case "${ONEDNN_MAX_CPU_ISA:-ALL}" in
    SSE41 | AVX | AVX2 | AVX2_VNNI | AVX2_VNNI_2 | AVX512_CORE | AVX512_CORE_VNNI) echo none; return ;;
  esac
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
# MKL takes its AVX2 path on a CPU without AVX-512 (or where
# MKL_ENABLE_INSTRUCTIONS caps it, as the emulation does), which sums
# products otherwise: "mkl-avx2".
blas_kernel() {
  if [ -n "$(sed -n 's/^FSDP_LIBTORCH:PATH=//p' "$build/CMakeCache.txt")" ]; then
    case "${MKL_ENABLE_INSTRUCTIONS:-AVX512}" in AVX512*) ;; *) echo mkl-avx2; return ;; esac
    if grep -qw avx512f /proc/cpuinfo; then echo mkl; else echo mkl-avx2; fi
    return
  fi
  python3 -c 'import ctypes
blas = ctypes.CDLL("libblas.so.3")
blas.openblas_get_corename.restype = ctypes.c_char_p
print(blas.openblas_get_corename().decode().lower())' 2>/dev/null || echo unknown
}
# On a kind of CPU with no recording of its own (an AVX2-only AMD, where
# bf16 is emulated and MKL takes another path), the losses are compared with
# the recording of the machine that wrote the fixtures, within a tolerance
# argued from the arithmetic, not bit for bit: fp32 kernels that block a
# product's sum otherwise differ in the last bits (one ulp, 6e-8, seen at
# step 6), bf16 ones by far less than one bf16 rounding (2^-8 = 3.9e-3;
# 2.5e-5 between AMX and AVX-512 BF16, 5e-5 with AVX2's emulation). A
# checkpoint read wrongly does not hide in that: step 4's loss is the
# forward of the weights read alone. The bit-for-bit resume of this code's
# own checkpoints is the `checkpoint` case's, on every kind of CPU.
declare -A tolerance=([sharded]=1e-5 [full]=1e-3)
within_tolerance() {  # EXPECTED ACTUAL RELATIVE: every step's loss within RELATIVE of the recording's
  jq -n --slurpfile want "$1" --slurpfile got "$2" --argjson tol "$3" '
    ($want | length) == ($got | length) and
    ([range($want | length)] | all(. as $i | $want[$i][0] == $got[$i][0] and
      (($want[$i][1] - $got[$i][1]) | fabs) <= $tol * ($want[$i][1] | fabs)))' | grep -q true
}
# The kinds the recordings without a suffix were made on, where they hold
# bit for bit: the fixtures' own machine (AVX-512 BF16 with OpenBLAS's Zen
# or Haswell kernels) and, for the wheel, MKL on a CPU with AVX-512.
this_kind_wrote_the_fixtures() {
  [ "$(cpu_bf16_isa)" = avx512bf16 ] && case "$(blas_kernel)" in zen|haswell|skylakex|cooperlake|mkl) true ;; *) false ;; esac
}
# resume_fixture SET NAME FLAGS...: resumes SET/NAME/step-3 to step LAST
# (6 for 04d839d's, 5 for dd8c28a's) and compares its losses with the
# recording beside it.
resume_fixture() {
  local set="$1" fixture="$2" last="$3"; shift 3
  local dir="$here/../fixtures/$set/$fixture" name="$set-$fixture" expected version kind other_version=0
  mkdir -p "$work/$name"
  cp -r "$dir/step-3" "$work/$name/"
  # --attention written: 04d839d wrote its attention out (the fused kernel of
  # LibTorch 2.x, the default there now, rounds otherwise in the last bits).
  train_run "$name" 2 --preset tiny --steps "$last" --ckpt-dir "$work/$name" --ckpt-every 3 --resume --attention written "$@"
  version=$(jq -r .libtorch "$work/$name.json")
  for expected in "$dir/losses-libtorch-$version-$(cpu_bf16_isa)-$(blas_kernel).jsonl" \
                  "$dir/losses-libtorch-$version-$(cpu_bf16_isa).jsonl" \
                  "$dir/losses-libtorch-$version.jsonl"; do
    [ ! -f "$expected" ] || break
  done
  [ -f "$expected" ] || [ "$set" = "$fixtures_04d839d" ] || {
    # dd8c28a's were recorded with Debian's LibTorch only: fp32 runs,
    # compared within the tolerance on another LibTorch.
    expected="$dir/losses-libtorch-1.13.0.jsonl"
    other_version=1
  }
  [ -f "$expected" ] || fail "no losses recorded for LibTorch $version in $dir (add them from a run of $set's commit)"
  [ "$(jq -r .first_step "$work/$name.json")" = 3 ] || fail "$name: did not resume at step 3"
  jq -c '[.step,.loss]' "$work/$name.jsonl" > "$work/$name.losses"
  kind="bf16 $(cpu_bf16_isa), BLAS kernel $(blas_kernel)"
  if [ "$other_version" = 0 ] && { [ "$(basename "$expected")" != "losses-libtorch-$version.jsonl" ] || this_kind_wrote_the_fixtures; }; then
    diff "$expected" "$work/$name.losses" ||
      fail "$name: the resumed losses differ from the recording's in $(basename "$expected") (this CPU: $kind)"
    echo "ok: $name resumed; steps 4-$last equal its commit's run bit for bit (LibTorch $version, $(basename "$expected"))"
  else
    within_tolerance "$expected" "$work/$name.losses" "${tolerance[$fixture]}" ||
      fail "$name: the resumed losses differ from the recording's in $(basename "$expected") by more than ${tolerance[$fixture]} relative (this CPU: $kind): $(tr '\n' ' ' < "$work/$name.losses")"
    echo "ok: $name resumed; steps 4-$last within ${tolerance[$fixture]} of its commit's run (LibTorch $version, this CPU: $kind, which has no recording of its own: $(basename "$expected"))"
  fi
}
fixtures_04d839d=checkpoint-04d839d
for fixture in sharded full; do
  # shellcheck disable=SC2086
  resume_fixture "$fixtures_04d839d" "$fixture" 6 ${flags[$fixture]}
done
# Frozen parameters (dd8c28a: a unit's frozen buffer was then a unit of its
# own; the format is the same): the unit layout a resume checks (names,
# order, parameters) and the values it loads.
tolerance[freeze]=1e-5
tolerance[lora]=1e-5
resume_fixture checkpoint-dd8c28a-frozen freeze 5 --freeze '^transformer.h.0.' --weight-decay 0.1
resume_fixture checkpoint-dd8c28a-frozen lora 5 --model llama --lora-rank 4 --weight-decay 0.1
