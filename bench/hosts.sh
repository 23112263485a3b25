#!/usr/bin/env bash
# Sharding strategies and ZeRO++'s options across 2 hosts x 2 ranks with
# the link between the hosts capped (scripts/netns-hosts.sh --rate; `none`:
# no cap), each cap in turn, every variant under it, beside the planner's
# figures calibrated on the same capped hosts. Root only. JSON lines to
# stdout, a table to stderr.
#   bench/hosts.sh BUILD_DIR [PRESET] [STEPS] [RATE...]
#   bench/hosts.sh build medium 3 1gbit 100mbit none
# FSDP_BENCH_VARIANTS (space-separated) picks variants; all by default:
#   full_shard hybrid_shard qwz hpz qgz all3
# (qwz, hpz, qgz: full_shard with --gather-quantization int8,
# --secondary-partition, --gradient-quantization int8; all3: all of them).
#
# Per variant and cap: the median step (the first excluded), the bytes of
# collectives crossing hosts per rank and step by the communicator's
# counters and by the wire (eth0's tx bytes of each host over the run,
# divided by its ranks and the steps: every step moves the same bytes and
# nothing else crosses), the bytes inside a host, peak tensor bytes and RSS
# (the largest of the ranks'); and the planner's: step, communication, compute, bytes across
# and inside, step peak and the secondary partition. The planner is
# calibrated per cap with `fsdp-plan calibrate --preset PRESET
# --ranks-per-node 2` on the same 2 x 2 hosts: the model's forward and
# backward on every rank at once, the step's collectives at the largest
# unit's size, and how much of them hides behind compute.
set -euo pipefail
build="$(cd "${1:?usage: bench/hosts.sh BUILD_DIR [PRESET] [STEPS] [RATE...]}" && pwd)"
preset="${2:-medium}"
steps="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 100mbit none)
variants="${FSDP_BENCH_VARIANTS:-full_shard hybrid_shard qwz hpz qgz all3}"
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/fsdp_bench_hosts.XXXXXX)
trap 'rm -rf "$work"' EXIT

for rate in "${rates[@]}"; do
  [[ "$rate" = none || "$rate" =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] ||
    { echo "bench/hosts.sh: a rate is like 1gbit, 100mbit or none, got '$rate'" >&2; exit 2; }
done

for rate in "${rates[@]}"; do
  cap=(); [ "$rate" = none ] || cap=(--rate "$rate")
  FSDP_BENCH_WORK="$work" FSDP_BENCH_RATE="$rate" FSDP_BENCH_PRESET="$preset" FSDP_BENCH_STEPS="$steps" \
    FSDP_BENCH_VARIANTS="$variants" "$here/../scripts/netns-hosts.sh" run 2 "${cap[@]}" -- bash -c '
    set -euo pipefail
    build="$0"; work="$FSDP_BENCH_WORK"; rate="$FSDP_BENCH_RATE"; preset="$FSDP_BENCH_PRESET"
    read -ra a <<< "$FSDP_NETNS_MPI_ARGS"; mpi=(); for x in "${a[@]}"; do mpi+=(--mpi-arg "$x"); done
    run4() { OMP_NUM_THREADS=1 "$build/fsdp-run" -n 4 --host 10.88.0.1:2,10.88.0.2:2 "${mpi[@]}" -- "$@"; }
    run4 "$build/fsdp-plan" calibrate --preset "$preset" --ranks-per-node 2 > "$work/cluster-$rate.json"
    tx() { ip netns exec "fsdp-h$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
    for variant in $FSDP_BENCH_VARIANTS; do
      strategy=full_shard; flags=()
      case "$variant" in
        full_shard) ;;
        hybrid_shard) strategy=hybrid_shard ;;
        qwz) flags=(--gather-quantization int8) ;;
        hpz) flags=(--secondary-partition) ;;
        qgz) flags=(--gradient-quantization int8) ;;
        all3) flags=(--gather-quantization int8 --secondary-partition --gradient-quantization int8) ;;
        *) echo "bench/hosts.sh: unknown variant $variant" >&2; exit 2 ;;
      esac
      "$build/fsdp-plan" --preset "$preset" --world 4 --nodes 2 --strategy "$strategy" "${flags[@]}" \
        --cluster "$work/cluster-$rate.json" --json > "$work/plan-$variant-$rate.json"
      before1=$(tx 1); before2=$(tx 2)
      run4 "$build/fsdp-train" --preset "$preset" --steps "$FSDP_BENCH_STEPS" --strategy "$strategy" \
        --ranks-per-node 2 --clip-grad-norm 0 "${flags[@]}" --summary "$work/$variant-$rate.json" \
        > "$work/$variant-$rate.out" 2>&1 || { cat "$work/$variant-$rate.out" >&2; exit 1; }
      echo "$(( $(tx 1) - before1 )) $(( $(tx 2) - before2 ))" > "$work/wire-$variant-$rate"
    done' "$build"
  for variant in $variants; do
    read -r wire1 wire2 < "$work/wire-$variant-$rate"
    jq -c --arg rate "$rate" --arg variant "$variant" --argjson wire1 "$wire1" --argjson wire2 "$wire2" \
      --argjson steps "$steps" --slurpfile plan "$work/plan-$variant-$rate.json" \
      --slurpfile cluster "$work/cluster-$rate.json" '
      $plan[0].strategies[0] as $q | $plan[0].cluster.strategies[0] as $t |
      {bench: "hosts", preset: .preset, variant: $variant, strategy: .strategy, link: $rate, steps: $steps,
       step_s: .step_s, planned_step_s: $t.step_s, planned_comm_s: $t.comm_s,
       planned_compute_s: $plan[0].cluster.compute_s, overlap: $plan[0].cluster.overlap,
       cross_host_bytes: .cross_host_bytes, planned_cross_host_bytes: $q.comm_bytes.cross_host,
       wire_bytes_per_rank_step: {host1: ($wire1 / 2 / $steps | floor), host2: ($wire2 / 2 / $steps | floor)},
       inside_host_bytes: .inside_host_bytes, planned_inside_host_bytes: $q.comm_bytes.inside_host,
       comm_bytes: .comm_bytes, peak_tensor_bytes: ([.peak_tensor_bytes] | flatten | max),
       planned_peak_tensor_bytes: $q.step_peak_bytes, peak_rss_bytes: ([.peak_rss_bytes] | flatten | max),
       planned_secondary_partition_bytes: $q.secondary_partition_bytes, exposed_comm_s: .exposed_comm_s,
       final_loss: .final_loss, collective_rates: $cluster[0].collectives.bytes_per_s,
       model_step_s: $cluster[0].model_step.forward_backward_s}' "$work/$variant-$rate.json"
  done
done | tee "$work/lines.jsonl"
# The table: measured against planned, per cap and variant.
jq -rs '(["link", "variant", "step s", "planned", "across B/rank", "wire B/rank (h1,h2)", "planned across",
          "inside B", "peak MiB", "planned MiB", "RSS MiB"] | @tsv),
        (.[] | [.link, .variant, (.step_s * 100 | round / 100), (.planned_step_s * 100 | round / 100),
                .cross_host_bytes, "\(.wire_bytes_per_rank_step.host1),\(.wire_bytes_per_rank_step.host2)",
                .planned_cross_host_bytes, .inside_host_bytes, (.peak_tensor_bytes / 1048576 | round),
                (.planned_peak_tensor_bytes / 1048576 | round), (.peak_rss_bytes / 1048576 | round)] | @tsv)' \
  "$work/lines.jsonl" | column -t -s $'\t' >&2
