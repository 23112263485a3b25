# Beyond one host, on hosts made here (scripts/netns-hosts.sh: network
# namespaces on a bridge, TCP only between them, OpenMPI's daemons started
# through scripts/netns-agent): full_shard and hybrid_shard across 2 hosts x
# 2 ranks equal W = 1 at the same global batch; hybrid keeps its gathers
# inside a host and sends only the shard's all-reduce across; a checkpoint
# written by both hosts resumes on 1 host and on 4; all ranks of one host
# killed mid-step, and one host's link taken down mid-step, end every other
# rank non-zero within the collective timeout. Needs root (skipped
# otherwise). The runner starts this case again inside the hosts.
if [ -z "${FSDP_NETNS_HOSTS:-}" ]; then
  [ "$(id -u)" -eq 0 ] && command -v ip > /dev/null && command -v tc > /dev/null ||
    skip "needs root, ip and tc (iproute2) to make the hosts"
  rm -rf "$work"
  exec "$here/../../scripts/netns-hosts.sh" run 4 -- bash "$here/run.sh" "$build" multi-host
fi
netns="$here/../../scripts/netns-hosts.sh"

read -ra netns_args <<< "$FSDP_NETNS_MPI_ARGS"
mpi=()
for a in "${netns_args[@]}"; do mpi+=(--mpi-arg "$a"); done
two_by_two=(--host 10.88.0.1:2,10.88.0.2:2 "${mpi[@]}")
four_by_one=(--host 10.88.0.1:1,10.88.0.2:1,10.88.0.3:1,10.88.0.4:1 "${mpi[@]}")

make_text_data
model=(--preset tiny --data "$work/data.txt" --steps 6 --clip-grad-norm 0)  # no norm all-reduce: comm bytes are the units'
train_run w1 1 "${model[@]}" --batch 8
for strategy in full_shard hybrid_shard; do
  train_run "$strategy" 4 "${two_by_two[@]}" -- "${model[@]}" --batch 2 --strategy "$strategy" \
    --ckpt-dir "$work/ck-$strategy" --ckpt-every 3
  compare_losses "$work/$strategy.jsonl" "$work/w1.jsonl" 1e-5 6
  echo "ok: $strategy across 2 hosts x 2 ranks equals W = 1"
done
json_is "$work/hybrid_shard.json" .shard_group_size 2
json_is "$work/hybrid_shard.json" .replicate_group_size 2
json_is "$work/full_shard.json" .shard_group_size 4
# Hybrid: the shards' all-reduce is what crosses hosts: the planner's figure, exactly.
plan_ar=$("$build/fsdp-plan" --preset tiny --world 4 --nodes 2 --strategy hybrid_shard --json |
          jq '.strategies[0].comm_bytes.all_reduce')
json_is "$work/hybrid_shard.json" .comm_bytes.all_reduce "$plan_ar"

# Written by both hosts, resumed on one host (4 ranks here) and on 4 hosts.
log_steps "$work/full_shard.jsonl" 4 6 > "$work/tail.jsonl"
for where in one-host four-hosts; do
  rm -rf "$work/ck-$where" && mkdir -p "$work/ck-$where" && cp -r "$work/ck-full_shard/step-3" "$work/ck-$where/"
  hosts=(); [ "$where" = four-hosts ] && hosts=("${four_by_one[@]}")
  train_run "resume-$where" 4 "${hosts[@]}" -- "${model[@]}" --batch 2 --strategy full_shard \
    --ckpt-dir "$work/ck-$where" --resume
  json_is "$work/resume-$where.json" .first_step 3
  compare_losses "$work/resume-$where.jsonl" "$work/tail.jsonl" 1e-5 3
done

# A host lost mid-step: every rank ends non-zero within the collective
# timeout (10 s) and some slack, the watchdog naming the collective where a
# rank saw it hang.
ranks_alive() {  # NAME: the trainer's processes of that run still there
  local p n=0
  for p in $(pgrep -f -- "$work/$1.jsonl"); do
    [ "$(basename "$(readlink -f "/proc/$p/exe" 2>/dev/null)")" = fsdp-train ] && n=$((n + 1))
  done
  echo "$n"
}
lose_host() {  # NAME HOW: kill (all ranks of host 2, kill -9) or link (host 2's link down)
  local name="$1" how="$2" pid rc=0 start took
  "$run" -n 4 "${two_by_two[@]}" -- "$train" --preset small --steps 200 --collective-timeout 10 \
    --log "$work/$name.jsonl" > "$work/$name.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ "$(grep -c '"step"' "$work/$name.jsonl" 2>/dev/null)" -ge 2 ] 2>/dev/null && break; sleep 0.1; done
  [ "$(grep -c '"step"' "$work/$name.jsonl" 2>/dev/null)" -ge 2 ] || { cat "$work/$name.out"; fail "$name: no step"; }
  start=$SECONDS
  if [ "$how" = kill ]; then
    for victim in $(ip netns pids fsdp-h2); do
      [ "$(basename "$(readlink -f "/proc/$victim/exe" 2>/dev/null)")" = fsdp-train ] && kill -9 "$victim"
    done
  else
    "$netns" link 2 down
  fi
  # Every rank gone within the timeout and some slack. (With the link down,
  # mpirun itself then waits for host 2's daemon until the link is back.)
  while [ "$(ranks_alive "$name")" -gt 0 ] && [ $(( SECONDS - start )) -le 40 ]; do sleep 0.2; done
  took=$(( SECONDS - start ))
  [ "$how" = kill ] || "$netns" link 2 up
  [ "$took" -le 40 ] || { kill -9 $(pgrep -f -- "$work/$name.jsonl") 2>/dev/null; cat "$work/$name.out"; fail "$name: ranks still running $took s after host 2 was lost"; }
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && kill -9 $(pgrep -f -- "$work/$name.jsonl") 2>/dev/null
  wait "$pid" || rc=$?
  [ "$rc" -ne 0 ] || { cat "$work/$name.out"; fail "$name: the job exited 0"; }
  echo "ok: $name: every rank ended within $took s of host 2 being lost (the job's status: $rc)"
  grep -m1 "collective watchdog" "$work/$name.out" || true
}
lose_host killed kill
lose_host unplugged link
grep -q "collective watchdog: .* did not complete within 10 s" "$work/unplugged.out" ||
  { cat "$work/unplugged.out"; fail "the watchdog did not name the collective when the link went down"; }
