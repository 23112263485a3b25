#!/usr/bin/env bash
# full_shard against hybrid_shard across 2 hosts x 2 ranks with the link
# between hosts capped (scripts/netns-hosts.sh --rate), alternating in one
# run, beside the planner's estimate calibrated on the same capped hosts.
# Root only. Writes JSON lines to stdout (and a table to stderr).
#   bench/hosts.sh BUILD_DIR [PRESET] [STEPS] [RATE...]
#   bench/hosts.sh build medium 3 1gbit 100mbit
set -euo pipefail
build="$(cd "${1:?usage: bench/hosts.sh BUILD_DIR [PRESET] [STEPS] [RATE...]}" && pwd)"
preset="${2:-medium}"
steps="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 100mbit)
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/fsdp_bench_hosts.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Inside one host: FLOP/s and the shared-memory bandwidth, with the 4 ranks
# the runs put on this machine's cores.
"$build/fsdp-run" -n 4 -- "$build/fsdp-plan" calibrate > "$work/local.json"
for rate in "${rates[@]}"; do
  FSDP_BENCH_WORK="$work" FSDP_BENCH_RATE="$rate" FSDP_BENCH_PRESET="$preset" FSDP_BENCH_STEPS="$steps" \
    "$here/../scripts/netns-hosts.sh" run 2 --rate "$rate" -- bash -c '
    set -euo pipefail
    build="$0"; work="$FSDP_BENCH_WORK"; rate="$FSDP_BENCH_RATE"
    read -ra a <<< "$FSDP_NETNS_MPI_ARGS"; mpi=(); for x in "${a[@]}"; do mpi+=(--mpi-arg "$x"); done
    # Between hosts: one rank on each, through the capped link.
    "$build/fsdp-run" -n 2 --host 10.88.0.1:1,10.88.0.2:1 "${mpi[@]}" -- "$build/fsdp-plan" calibrate > "$work/inter.json"
    jq -s ".[0] + {inter_node_bandwidth: .[1].intra_node_bandwidth, inter_node_latency: .[1].intra_node_latency}" \
      "$work/local.json" "$work/inter.json" > "$work/cluster-$rate.json"
    "$build/fsdp-plan" --preset "$FSDP_BENCH_PRESET" --world 4 --nodes 2 --cluster "$work/cluster-$rate.json" --json \
      > "$work/plan-$rate.json"
    for strategy in full_shard hybrid_shard; do
      "$build/fsdp-run" -n 4 --host 10.88.0.1:2,10.88.0.2:2 "${mpi[@]}" -- "$build/fsdp-train" \
        --preset "$FSDP_BENCH_PRESET" --steps "$FSDP_BENCH_STEPS" --strategy "$strategy" --clip-grad-norm 0 \
        --summary "$work/$strategy-$rate.json" > "$work/$strategy-$rate.out" 2>&1 ||
        { cat "$work/$strategy-$rate.out" >&2; exit 1; }
    done' "$build"
  for strategy in full_shard hybrid_shard; do
    s="$work/$strategy-$rate.json"
    # Inter-host bytes per step and rank, by our counters: full_shard moves
    # every collective over the world ring (half of whose links cross hosts);
    # hybrid only the shards' all-reduce over the replicate group.
    jq -c --arg rate "$rate" --arg strategy "$strategy" --slurpfile plan "$work/plan-$rate.json" \
      --slurpfile cluster "$work/cluster-$rate.json" '
      ($plan[0].cluster.strategies[] | select(.strategy == $strategy)) as $p |
      ($plan[0].strategies[] | select(.strategy == $strategy)) as $q |
      {bench: "hosts", preset: .preset, strategy: $strategy, link: $rate, step_s: .step_s,
       comm_bytes_per_step: .comm_bytes, inter_host_bytes_per_step:
         (if $strategy == "hybrid_shard" then .comm_bytes.all_reduce
          else .comm_bytes.all_gather + .comm_bytes.reduce_scatter + .comm_bytes.all_reduce end),
       planned_inter_host_bytes: (if $strategy == "hybrid_shard" then $q.comm_bytes.all_reduce else $q.comm_bytes.total end),
       planned_step_s: $p.step_s, planned_comm_s: $p.comm_s, planned_compute_s: $plan[0].cluster.compute_s,
       inter_node_bandwidth: $cluster[0].inter_node_bandwidth, exposed_comm_s: .exposed_comm_s}' "$s"
  done
done
