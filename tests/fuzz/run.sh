#!/usr/bin/env bash
# The fuzz targets, built with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer against the LibTorch of a build folder, each run
# for a bounded time from its seed corpus. Fails on any crash, sanitizer
# report, exception other than c10::Error, or input slower than 10 s.
#
#   tests/fuzz/run.sh BUILD_DIR build             build the five targets
#   tests/fuzz/run.sh BUILD_DIR TARGET SECONDS    build TARGET if needed, fuzz it
#   tests/fuzz/run.sh BUILD_DIR seeds             remake the committed seeds
#
# TARGET is one of
#   header    the safetensors header parser alone (no file)
#   reader    safetensors::Reader on the input written as a file: offsets,
#             checksum lookup and verification, every tensor read whole and in
#             part and compared with the file's bytes
#   metadata  a checkpoint's metadata.json, next to a real checkpoint's data
#             files (checkpoint/): list_checkpoints, SavedCheckpoint,
#             read_range and convert_to_full
#   tokenizer a tokenizer.json read by fsdp::text::Tokenizer, then a text of
#             every byte encoded and decoded
#   config    a Hugging Face config.json read by hugging_face::read_config,
#             written back by config_json and read again
# Seeds: corpus-safetensors/ (header, reader) and corpus-metadata/
# (metadata), made by "seeds" (make_seeds.cpp and a short fsdp-train run);
# corpus-tokenizer/ (fsdp-data's own tokenizer, compact, and as Llama 3's
# and Qwen's pre-tokenizer and normalizer spell theirs, and Llama 2's
# SentencePiece-style form) and corpus-config/
# (GPT-2's and a Llama's config.json), written by hand;
# the regress_* ones are inputs that crashed the library before its fix.
# Checksums: checkpoint/ and the metadata seeds were written before XXH3
# (FNV-1a, no algorithm named), as was corpus-safetensors/fnv1a64_*, kept so
# that the old checksum's path is fuzzed too; sharded_xxh3 is sharded
# rewritten by write_checkpoint_metadata (XXH3-64, named).
# A crashing input is kept as BUILD_DIR/fuzz/crash-*; rerun it with
# BUILD_DIR/fuzz/TARGET_fuzz FILE. FSDP_FUZZ_OUT overrides BUILD_DIR/fuzz.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "$1" && pwd)"
what="${2:-build}"
out="${FSDP_FUZZ_OUT:-$build/fuzz}"
mkdir -p "$out"

# LibTorch's defines and include folders as the library was compiled with
# them, and the link line of a tool that uses the library: whichever LibTorch
# this build folder has (Debian's or a wheel's).
flags="$build/CMakeFiles/fsdp.dir/flags.make"
link="$build/CMakeFiles/fsdp-ckpt.dir/link.txt"
for f in "$flags" "$link" "$build/libfsdp.a"; do
  [ -f "$f" ] || { echo "fuzz: $f is missing: build $build first (CMake's Makefile generator)" >&2; exit 2; }
done
torch_flags="$({ sed -n 's/^CXX_DEFINES = //p; s/^CXX_INCLUDES = //p' "$flags"
                 sed -n 's/^CXX_FLAGS = //p' "$flags" | grep -o -- '-D[^ ]*\|-std=[^ ]*'; } | tr '\n' ' ')"
# The link line without the compiler, the tool's object and output; its
# options (a wheel's -rpath-link to its CUDA libraries) and libraries stay.
libs="$(sed -e 's|^[^ ]* ||' -e 's|"\{0,1\}CMakeFiles/fsdp-ckpt\.dir/[^ ]*\.o"\{0,1\}||' -e 's| -o fsdp-ckpt | |' \
            -e "s| libfsdp\.a | $build/libfsdp.a |" "$link")"

# Through the compiler cache where the build folder has one (scripts/setup.sh
# says why its settings): paths inside the checkout made relative, and the
# object's folder left out of the hash (-g would put it in), so that every
# clone on this machine shares the entries.
compiler=clang++
if grep -q '^CMAKE_CXX_COMPILER_LAUNCHER:.*ccache' "$build/CMakeCache.txt" && command -v ccache > /dev/null; then
  compiler="env CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=time_macros,include_file_mtime,include_file_ctime ccache clang++"
fi
build_target() {
  make -s -j2 -f "$here/fuzz.mk" ROOT="$root" OUT="$out" TORCH_FLAGS="$torch_flags" LIBS="$libs" CXX="$compiler" "$@"
}

# Remakes the committed seeds and checkpoint/ (needs fsdp-train and mpirun).
make_seeds() {
  build_target "$out/make_seeds"
  "$out/make_seeds" "$here/corpus-safetensors"
  # A real checkpoint of a small GPT, saved by fsdp-train after two steps:
  # sharded at W = 3 (its units of 208 and 872 elements pad), full at W = 2.
  local ck
  ck="$(mktemp -d)"
  for i in $(seq 0 3199); do printf "\\$(printf %03o $(( (i * 7 + i / 5) % 16 )))"; done >"$ck/tokens.txt"
  local model=(--preset tiny --layers 1 --width 8 --heads 2 --vocab 16 --context 8 --batch 2 --steps 2 --data "$ck/tokens.txt")
  "$build/fsdp-run" -n 3 -- "$build/fsdp-train" "${model[@]}" --ckpt-dir "$ck/sharded" --ckpt-format sharded >/dev/null
  "$build/fsdp-run" -n 2 -- "$build/fsdp-train" "${model[@]}" --ckpt-dir "$ck/full" --ckpt-format full >/dev/null
  rm -rf "$here/checkpoint" && mkdir -p "$here/checkpoint" "$here/corpus-metadata"
  cp "$ck"/sharded/step-2/*.safetensors "$ck"/full/step-2/*.safetensors "$here/checkpoint/"
  cp "$ck/sharded/step-2/metadata.json" "$here/corpus-metadata/sharded"
  cp "$ck/full/step-2/metadata.json" "$here/corpus-metadata/full"
  # As checkpoints from before optimizers other than AdamW say it (the
  # fuzzer puts the checksum right), and compact as another writer might.
  jq 'del(.optimizer.state, .optimizer.has_state)' "$ck/sharded/step-2/metadata.json" >"$here/corpus-metadata/sharded_no_state"
  jq -c . "$ck/full/step-2/metadata.json" >"$here/corpus-metadata/full_compact"
  rm -rf "$ck"
}

case "$what" in
  build) build_target all; exit 0 ;;
  seeds) make_seeds; exit 0 ;;
  # Inputs a little larger than the largest seed: small inputs run fast.
  header | reader) corpus=corpus-safetensors dict=safetensors.dict max_len=1024 ;;
  metadata) corpus=corpus-metadata dict=metadata.dict max_len=4096 ;;
  tokenizer) corpus=corpus-tokenizer dict=tokenizer.dict max_len=8192 ;;
  config) corpus=corpus-config dict=config.dict max_len=2048 ;;
  *) echo "fuzz: unknown target '$what' (expected build, header, reader, metadata, tokenizer or config)" >&2; exit 2 ;;
esac
seconds="${3:?seconds to fuzz}"
build_target "$what"

# A working corpus in the build folder, seeded with the committed files; it
# keeps what earlier runs found.
work="$out/corpus-$what"
mkdir -p "$work"
cp "$here/$corpus"/* "$work"/
# ASan's default of aborting on a failed allocation stays: an input that
# makes the library allocate without bound is a finding.
# The targets write their input files under TMPDIR; one a crash left stays here.
export TMPDIR="$out/tmp-$what"  # its own: two targets may fuzz at once (ctest -j2)
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
status=0
"$out/${what}_fuzz" -dict="$here/$dict" -max_len="$max_len" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix="$out/" -print_final_stats=1 "$work" >"$out/$what.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  # The sanitizer's or libFuzzer's report, the input and where it was kept.
  tail -40 "$out/$what.log" >&2
  echo "fuzz: ${what}_fuzz failed (exit $status); rerun the input above with $out/${what}_fuzz FILE" >&2
  exit 1
fi
grep -E "^Done|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" "$out/$what.log"
