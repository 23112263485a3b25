#!/usr/bin/env bash
# Checkpoint throughput in MB/s (10^6 bytes per second): save, load
# (--resume) and `fsdp-ckpt verify`, both formats (fp32 masters + AdamW
# state), plus full weight files (--save-final, --init-from), for each preset
# at each world size. One fp32 training step first (the files hold fp32 masters
# either way; bf16 would not make it quicker on CPUs without bf16 arithmetic).
#   bench/checkpoints.sh [OUTDIR] [PRESETS...]          (default: medium large)
# Environment:
#   WORLDS   world sizes (default "2 4")
#   FORMATS  checkpoint formats (default "sharded full")
#   ROUNDS   repeats of every case (default 1)
#   CACHE    warm: the checkpoint's files are read into the page cache first,
#            so loads and verify measure the library, not the disk; cold: they
#            are dropped from it first (dd iflag=nocache, those files only), so
#            they are read from the disk (saves write with O_DIRECT and leave
#            nothing cached: a load right after a save is cold); both (default)
#   BIN      the folder of fsdp-run, fsdp-train and fsdp-ckpt (default build;
#            point it at a copy of an older build for a before/after run)
# Save and load figures are the trainer's own (the library call, all ranks,
# bytes = the checkpoint directory); verify is timed here and includes
# starting fsdp-ckpt (about 0.2 s of LibTorch loading).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/checkpoints}"
shift || true
presets=("${@:-medium large}")
worlds="${WORLDS:-2 4}"
formats="${FORMATS:-sharded full}"
rounds="${ROUNDS:-1}"
cache="${CACHE:-both}"
bin="${BIN:-build}"
case "$cache" in warm) caches=(warm) ;; cold) caches=(cold) ;; both) caches=(warm cold) ;;
  *) echo "checkpoints.sh: CACHE must be warm, cold or both, got '$cache'" >&2; exit 2 ;; esac
mkdir -p "$out"

# Puts every file under $1 into the page cache (warm), or drops them from it (cold).
prepare_cache() {
  if [ "$2" = warm ]; then find "$1" -type f -exec cat {} + > /dev/null
  else find "$1" -type f -exec dd if={} iflag=nocache count=0 status=none \; ; fi
}

# "what MB s" -> one aligned line with the rate.
row() {
  awk -v what="$1" -v mb="$2" -v s="$3" \
    'BEGIN { printf "  %-14s %9.1f MB %7.2f s %6s MB/s\n", what, mb, s, (s > 0 ? sprintf("%.0f", mb / s) : "-") }'
}
# Seconds since $1 (a `date +%s.%N`).
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { print b - a }'; }

# The "(N MB in S s" figures of the trainer's line matching $1 in file $2.
trainer_figures() { grep -h -E "$1" "$2" | sed -E 's/.*[( ]([0-9.]+) MB in ([0-9.]+) s.*/\1 \2/' | head -1; }

# What of verify's time is starting the process (the second start: the first reads the binaries).
"$bin/fsdp-ckpt" --help > /dev/null
start=$(date +%s.%N)
"$bin/fsdp-ckpt" --help > /dev/null
startup=$(since "$start")

for preset in ${presets[@]}; do
  for world in $worlds; do
    for format in $formats; do
      for round in $(seq 1 "$rounds"); do
        dir="$out/${preset}_w${world}_${format}"
        rm -rf "$dir" && mkdir -p "$dir"
        common=(--preset "$preset" --ckpt-dir "$dir/ck" --ckpt-format "$format")
        final=(); [ "$format" = sharded ] || final=(--save-final "$dir/full.safetensors")
        "$bin/fsdp-run" -n "$world" -- "$bin/fsdp-train" "${common[@]}" --steps 1 --ckpt-every 1 "${final[@]}" \
          > "$dir/save.out" 2>&1 || { cat "$dir/save.out" >&2; exit 1; }
        echo "== $preset W=$world $format, round $round ($bin; verify includes ${startup} s of fsdp-ckpt start-up)"
        row save $(trainer_figures "checkpoint:" "$dir/save.out")
        [ "$format" = sharded ] || row save-final $(trainer_figures "saved final weights" "$dir/save.out")
        ckpt="$dir/ck/step-1"
        mb=$(du -sb "$ckpt" | awk '{ print $1 / 1e6 }')
        for c in "${caches[@]}"; do
          prepare_cache "$dir" "$c"
          "$bin/fsdp-run" -n "$world" -- "$bin/fsdp-train" "${common[@]}" --steps 1 --resume > "$dir/load-$c.out" 2>&1 ||
            { cat "$dir/load-$c.out" >&2; exit 1; }
          row "load $c" $(trainer_figures "resumed from" "$dir/load-$c.out")
          prepare_cache "$dir" "$c"
          start=$(date +%s.%N)
          "$bin/fsdp-ckpt" verify "$ckpt" > "$dir/verify-$c.out" 2>&1 || { cat "$dir/verify-$c.out" >&2; exit 1; }
          row "verify $c" "$mb" "$(since "$start")"
          if [ "$format" = full ]; then
            prepare_cache "$dir" "$c"
            "$bin/fsdp-run" -n "$world" -- "$bin/fsdp-train" --preset "$preset" --steps 1 \
              --init-from "$dir/full.safetensors" > "$dir/init-$c.out" 2>&1 || { cat "$dir/init-$c.out" >&2; exit 1; }
            row "init-from $c" $(trainer_figures "initialized from" "$dir/init-$c.out")
          fi
        done
        rm -rf "$dir/ck" "$dir/full.safetensors"
      done
    done
  done
done | tee "$out/summary.txt"
