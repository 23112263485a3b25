#!/usr/bin/env bash
# Checkpoint save and load times, both formats (fp32 masters + AdamW state),
# and full weight files, for medium and large at W = 2 and 4. One bf16
# training step first (the files hold fp32 either way; bf16 only makes the
# step quick). Loads read from the page cache the save just filled.
#   bench/checkpoints.sh [OUTDIR] [PRESETS...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/checkpoints}"
shift || true
presets=("${@:-medium large}")
mkdir -p "$out"
for preset in ${presets[@]}; do
  for world in 2 4; do
    for format in sharded full; do
      dir="$out/${preset}_w${world}_${format}"
      rm -rf "$dir" && mkdir -p "$dir"
      common=(--preset "$preset" --param-dtype bf16 --ckpt-dir "$dir/ck" --ckpt-format "$format")
      final=(); [ "$format" = sharded ] || final=(--save-final "$dir/full.safetensors")
      build/fsdp-run -n "$world" -- build/fsdp-train "${common[@]}" --steps 1 --ckpt-every 1 "${final[@]}" > "$dir/save.out" 2>&1
      build/fsdp-run -n "$world" -- build/fsdp-train "${common[@]}" --steps 1 --resume > "$dir/load.out" 2>&1
      files=("$dir/save.out" "$dir/load.out")
      if [ "$format" = full ]; then
        build/fsdp-run -n "$world" -- build/fsdp-train --preset "$preset" --param-dtype bf16 --steps 1 \
          --init-from "$dir/full.safetensors" > "$dir/init.out" 2>&1
        files+=("$dir/init.out")
      fi
      echo "== $preset W=$world $format"
      grep -h -E "checkpoint:|saved final|resumed from|initialized from" "${files[@]}"
      rm -rf "$dir/ck" "$dir/full.safetensors"
    done
  done
done | tee "$out/summary.txt"
