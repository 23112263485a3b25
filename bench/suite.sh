#!/usr/bin/env bash
# The benchmark of shared/spec/bench.md: its variants back to back in one
# run, alternating over rounds, at an equal global batch and equal total
# threads (fsdp-run gives each rank cores / ranks). Writes one JSON object
# per variant and round (the trainer's --summary, with per-rank lists) to
# OUT/results.jsonl and prints a table of medians and ratios.
#   bench/suite.sh [--preset P] [--batch B] [--steps S] [--rounds R] [--out DIR] [--variants "V ..."]
#                  [--attention auto|sdpa|written] [--report]
# --report: only print the table of OUT/results.jsonl. --attention: fsdp-train's
# (auto: fused where its LibTorch has scaled_dot_product_attention); the PyTorch
# peers compute the same one (sdpa, or written where fsdp-train's is).
# B is the per-rank batch at W = 2 (even): local runs 2B, W = 4 runs B/2.
#
# PyTorch itself (bench/peer.py, from the wheel in .venv/ that the LibTorch 2.x
# build links: scripts/setup.sh wheel) runs as variants too:
#   torch_ENGINE[_bf16][_w1|_w4], ENGINE one of ddp, fsdp1, fsdp2, local (W = 1)
# e.g. torch_ddp, torch_fsdp2_bf16, torch_ddp_w4. Each fsdp-cpp row is then
# also given as a ratio to torch_ddp and torch_fsdp2 of its own W and dtype.
# Compare like with like: FSDP_BUILD=build-wheel bench/suite.sh ... (the
# LibTorch of the same wheel); FSDP_PYTHON overrides .venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FSDP_BUILD:-build}"
preset=medium batch=2 steps=4 rounds=1 out=bench/results/suite report_only=0 attention=auto
variants="local no_shard no_shard_ac no_shard_bf16 zero1 shard_grad_op full_shard full_shard_noprefetch full_shard_ac full_shard_bf16 full_shard_lowmem no_shard_w4 full_shard_w4"
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --attention) attention="$2"; shift 2 ;;
    --report) report_only=1; shift ;;
    *) echo "bench/suite.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $((batch % 2)) -eq 0 ] || { echo "bench/suite.sh: --batch must be even (W = 4 runs B/2)" >&2; exit 2; }

# variant -> "ranks trainer-flags..."
variant_args() {
  # V_plaincopy: V with OpenMPI's copies through the shared FIFO instead of
  # Cross Memory Attach (fsdp-run's FSDP_MPI_SINGLE_COPY=none).
  if [[ "$1" == *_plaincopy ]]; then variant_args "${1%_plaincopy}"; return; fi
  # V_nocache: V with every freed host buffer given back at once
  # (fsdp-train --no-block-cache), as before the block cache.
  if [[ "$1" == *_nocache ]]; then
    [[ "$1" != torch_* ]] || { echo "bench/suite.sh: $1: _nocache is fsdp-cpp's (PyTorch has no block cache to turn off)" >&2; return 1; }
    local inner; inner="$(variant_args "${1%_nocache}")" || return 1
    echo "$inner --no-block-cache"; return
  fi
  case "$1" in
    torch_*)
      [[ "$1" =~ ^torch_(local|ddp|fsdp1|fsdp2)(_bf16)?(_w1|_w4)?$ ]] ||
        { echo "bench/suite.sh: unknown variant $1 (torch_ENGINE[_bf16][_w1|_w4], ENGINE: local ddp fsdp1 fsdp2)" >&2; return 1; }
      local engine="${BASH_REMATCH[1]}" dtype=fp32 ranks=2
      [ -z "${BASH_REMATCH[2]}" ] || dtype=bf16
      case "${BASH_REMATCH[3]}" in _w1) ranks=1 ;; _w4) ranks=4 ;; esac
      [ "$engine" != local ] || ranks=1
      echo "$ranks --batch $((2 * batch / ranks)) --engine $engine --dtype $dtype" ;;
    local) echo "1 --batch $((2 * batch)) --strategy no_shard" ;;
    no_shard|zero1|shard_grad_op) echo "2 --batch $batch --strategy $1" ;;
    no_shard_ac) echo "2 --batch $batch --strategy no_shard --activation-checkpointing" ;;
    no_shard_bf16) echo "2 --batch $batch --strategy no_shard --param-dtype bf16" ;;
    full_shard) echo "2 --batch $batch --strategy full_shard --forward-prefetch --backward-prefetch pre" ;;
    full_shard_noprefetch) echo "2 --batch $batch --strategy full_shard --backward-prefetch none" ;;
    full_shard_ac) echo "2 --batch $batch --strategy full_shard --forward-prefetch --activation-checkpointing" ;;
    # bf16 parameters with fp32 reductions, as torch_fsdp2_bf16.
    full_shard_bf16) echo "2 --batch $batch --strategy full_shard --forward-prefetch --param-dtype bf16 --reduce-dtype fp32" ;;
    full_shard_bf16_w4) echo "4 --batch $((batch / 2)) --strategy full_shard --forward-prefetch --param-dtype bf16 --reduce-dtype fp32" ;;
    local_bf16) echo "1 --batch $((2 * batch)) --strategy no_shard --param-dtype bf16" ;;
    # The least memory: sublayer units, recomputed, nothing gathered ahead.
    full_shard_lowmem) echo "2 --batch $batch --strategy full_shard --activation-checkpointing --wrap sublayer --backward-prefetch none" ;;
    hybrid_shard) echo "4 --batch $((batch / 2)) --strategy hybrid_shard --ranks-per-node 2 --forward-prefetch" ;;
    no_shard_w4) echo "4 --batch $((batch / 2)) --strategy no_shard" ;;
    full_shard_w4) echo "4 --batch $((batch / 2)) --strategy full_shard --forward-prefetch" ;;
    *) echo "bench/suite.sh: unknown variant $1" >&2; return 1 ;;
  esac
}

python="${FSDP_PYTHON:-.venv/bin/python}"
if [ "$report_only" = 0 ] && [[ " $variants " == *" torch_"* ]]; then
  "$python" -c "import torch" 2>/dev/null ||
    { echo "bench/suite.sh: the torch_* variants need PyTorch: $python cannot import torch (run scripts/setup.sh wheel, or set FSDP_PYTHON)" >&2; exit 2; }
  echo "PyTorch side: $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); fsdp-cpp: $build/ ($(sed -n 's/^-- fsdp-cpp: LibTorch \([^ ]*\) .*/LibTorch \1/p' "$build.log" 2>/dev/null | tail -1))" >&2
fi
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
# The peers' attention: fsdp-train's as it resolves it (its summary's
# "attention"), from a one-step tiny run.
peer_attention=sdpa
if [ "$report_only" = 0 ] && [[ " $variants " == *" torch_"* ]]; then
  probe="$(mktemp -d)"
  "$build/fsdp-run" -n 1 -- "$build/fsdp-train" --preset tiny --steps 1 --attention "$attention" \
    --summary "$probe/summary.json" > "$probe/out" 2>&1 || { cat "$probe/out" >&2; exit 1; }
  peer_attention=$(jq -r .attention "$probe/summary.json")
  rm -rf "$probe"
fi

# run_variant V ROUND: one run, its summary in $out/summary.json
run_variant() {
  local ranks flags
  read -r ranks flags <<<"$(variant_args "$1")"
  echo "round $2: $1 (W=$ranks $flags)" >&2
  rm -f "$out/summary.json"
  if [[ "$1" == torch_* ]]; then
    local threads=$((cores / ranks)); [ "$threads" -ge 1 ] || threads=1
    local launch=("$python")
    [[ "$flags" == *"--engine local"* ]] || launch=("$python" -m torch.distributed.run --standalone --nproc-per-node "$ranks")
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads "${launch[@]}" bench/peer.py --preset "$preset" --steps "$steps" --attention "$peer_attention" $flags \
      --summary "$out/summary.json" > "$out/$1.r$2.out" 2>&1 || { cat "$out/$1.r$2.out" >&2; return 1; }
  else
    local single_copy="${FSDP_MPI_SINGLE_COPY:-auto}"
    [[ "$1" != *_plaincopy* ]] || single_copy=none
    # shellcheck disable=SC2086
    FSDP_MPI_SINGLE_COPY=$single_copy "$build/fsdp-run" -n "$ranks" -- "$build/fsdp-train" --preset "$preset" --steps "$steps" --attention "$attention" $flags \
      --print-every "$steps" --summary "$out/summary.json" > "$out/$1.r$2.out" 2>&1 ||
      { cat "$out/$1.r$2.out" >&2; return 1; }
  fi
}

mkdir -p "$out"
results="$out/results.jsonl"
[ "$report_only" = 1 ] || : > "$results"
[ "$report_only" = 1 ] && rounds=0
for round in $(seq 1 "$rounds"); do
  for v in $variants; do
    run_variant "$v" "$round" || exit 1
    read -r ranks _ <<<"$(variant_args "$v")"
    jq -c --arg v "$v" --argjson round "$round" --argjson ranks "$ranks" \
      '{variant: $v, round: $round, oversubscribed: ($ranks > '"$(nproc)"')} + .' "$out/summary.json" >> "$results"
  done
done

# The table: medians over rounds; ratios to no_shard (W = 2) and to local
# (torch_local for PyTorch's rows),
# and to PyTorch's DDP and FSDP2 of the same W and dtype (time and peak RSS).
jq -s -r '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def r2: . * 100 | round / 100;
  def mib: if . == null then "-" else . / 1048576 | round | tostring end;
  group_by(.variant) | map({variant: .[0].variant, W: .[0].world_size, over: .[0].oversubscribed,
      dtype: .[0].param_dtype, torch: (.[0].strategy | startswith("torch_")),
      step_s: (map(.step_s) | median), tokens_per_s: (map(.tokens_per_s) | median),
      exposed: (map(.exposed_comm_s) | if .[0] == null then null else median end),
      peak: (map(.peak_tensor_bytes // [] | max) | max), peak_predicted: .[0].peak_tensor_bytes_predicted,
      state: (.[0].model_state_bytes // [] | max), predicted: .[0].model_state_bytes_predicted,
      rss: (map(.peak_rss_bytes | max) | max)}) as $rows
  | ($rows | map(select(.variant == "no_shard")) | .[0].step_s // null) as $ddp
  | ($rows | map(select(.variant == "local")) | .[0].step_s // null) as $local
  | ($rows | map(select(.variant == "torch_local")) | .[0].step_s // null) as $torch_local
  | def peer($engine; $row): $rows | map(select(.variant | test("^torch_" + $engine + "(_bf16)?(_w[14])?$"))
        | select(.W == $row.W and .dtype == $row.dtype)) | .[0] // null;
    def ratio($a; $b): if $a == null or $b == null then "-" else ($a / $b | r2 | tostring) end;
  ["variant", "W", "dtype", "step_s", "tok/s", "x no_shard", "exposed comm", "scaling eff.",
     "time x torch DDP", "time x torch FSDP2", "RSS x torch DDP", "RSS x torch FSDP2",
     "peak tensors MiB (measured / planner)", "model state B (measured / planner)", "peak RSS MiB"],
    ($rows[] | . as $row | peer("ddp"; $row) as $tddp | peer("fsdp2"; $row) as $tfsdp2
      | [.variant, (.W | tostring) + (if .over then "*" else "" end), .dtype, (.step_s * 1000 | round / 1000),
      (.tokens_per_s | round), (if $ddp then (.step_s / $ddp | r2) else "-" end),
      (if .exposed == null then "-" else (.exposed / .step_s * 1000 | round / 10 | tostring) + "%" end),
      # scaling efficiency: against the one-process run of the same engine
      ((if .torch then $torch_local else $local end) as $one
       | if $one and (.variant | test("^(torch_)?local$") | not) then ($one / .step_s * 100 | round | tostring) + "%" else "-" end),
      ratio(.step_s; $tddp.step_s), ratio(.step_s; $tfsdp2.step_s), ratio(.rss; $tddp.rss), ratio(.rss; $tfsdp2.rss),
      (if .torch then "-" else "\(.peak | mib) / \(.peak_predicted | mib)" end),
      (if .torch then "-" else "\(.state) / \(.predicted)" end), (.rss | mib)])
  | @tsv' "$results" | column -t -s $'\t' | tee "$out/table.txt"
echo "(* oversubscribed: more ranks than the $(nproc) cores. Results: $results)"
