#!/usr/bin/env bash
# Builds the safetensors fuzz target with clang's libFuzzer and
# AddressSanitizer, and runs it for a bounded time from the seed corpus.
# Fails on any crash, sanitizer report or timeout.
#   tests/fuzz/run.sh BUILD_DIR SECONDS
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="$1"
seconds="${2:-30}"
mkdir -p "$build/fuzz"
clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$root/include" "$here/safetensors_fuzz.cpp" "$root/src/state_dict/safetensors_header.cpp" \
  -lc10 -o "$build/fuzz/safetensors_fuzz"
# A working corpus in the build folder, seeded with the committed files.
corpus="$build/fuzz/corpus"
mkdir -p "$corpus"
cp "$here"/corpus/* "$corpus"/
"$build/fuzz/safetensors_fuzz" -dict="$here/safetensors.dict" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
  "$corpus" 2>&1 | tail -15
