# The benchmark suite end to end on tiny: every variant runs once, and for
# each the planner's model state equals the measured (results.jsonl, the
# trainer's summaries); the table has a row for each. With PyTorch at hand
# (the wheel's .venv, or FSDP_PYTHON), its peers run too: the same model,
# data and initialization give the same losses as fsdp-train at the same W,
# and every fsdp-cpp row gets its ratios to PyTorch DDP and FSDP2.

ours="local no_shard no_shard_ac no_shard_bf16 zero1 shard_grad_op full_shard full_shard_noprefetch full_shard_ac
      full_shard_bf16 full_shard_lowmem no_shard_w4 full_shard_w4"
peers="torch_local torch_ddp torch_fsdp1 torch_fsdp2 torch_fsdp2_bf16 torch_ddp_w4 torch_fsdp2_w4"
python="${FSDP_PYTHON:-$here/../../.venv/bin/python}"
if "$python" -c "import torch" 2>/dev/null; then
  variants="$ours $peers"
else
  echo "note: no PyTorch at $python (scripts/setup.sh wheel makes it): the torch_* peers are not run"
  variants="$ours" peers=""
fi
# shellcheck disable=SC2086
FSDP_BUILD="$build" FSDP_PYTHON="$python" "$here/../../bench/suite.sh" --preset tiny --steps 2 --out "$work/suite" \
  --variants "$(echo $variants)" > "$work/suite.out" 2>&1 || { cat "$work/suite.out"; fail "the benchmark suite failed"; }
cat "$work/suite.out"
results="$work/suite/results.jsonl"
require_steps "$results" "$(wc -w <<<"$variants")"
# peer_matches PEER OURS: the same final loss (relative 1e-4), and the ratio columns filled.
peer_matches() {
  log_ok "$results" "(map(select(.variant == \"$1\"))[0].final_loss) as \$a | (map(select(.variant == \"$2\"))[0].final_loss) as \$b
                     | ((\$a - \$b) | fabs) <= 1e-4 * (\$b | fabs)" \
    "$1 ended at loss $(jq -s "map(select(.variant == \"$1\"))[0].final_loss" "$results"), $2 at $(jq -s "map(select(.variant == \"$2\"))[0].final_loss" "$results")"
}
version() { jq -rs "map(select(.variant == \"$1\"))[0].libtorch" "$results"; }
if [ -n "$peers" ] && [ "$(version local)" != "$(version torch_local)" ]; then
  # Another LibTorch draws other initial weights from the same seed.
  echo "note: fsdp-cpp built on LibTorch $(version local), PyTorch $(version torch_local): losses not compared"
elif [ -n "$peers" ]; then
  peer_matches torch_local local
  for p in torch_ddp torch_fsdp1 torch_fsdp2; do peer_matches "$p" no_shard; done
  peer_matches torch_fsdp2_bf16 full_shard_bf16
  peer_matches torch_ddp_w4 no_shard_w4
  peer_matches torch_fsdp2_w4 full_shard_w4
fi
if [ -n "$peers" ]; then
  for p in $peers; do grep -q "^$p " "$work/suite/table.txt" || fail "no row for $p in the table"; done
  # full_shard's row: time and RSS ratios to torch DDP and FSDP2, as numbers.
  header=$(head -1 "$work/suite/table.txt")
  for column in "time x torch DDP" "time x torch FSDP2" "RSS x torch DDP" "RSS x torch FSDP2"; do
    grep -qF "$column" <<<"$header" || fail "the table has no column '$column'"
  done
  awk '$1 == "full_shard" { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) n++; exit !(n >= 10) }' \
    "$work/suite/table.txt" || fail "full_shard's row lacks its ratios: $(grep '^full_shard ' "$work/suite/table.txt")"
fi
for v in $ours; do
  log_is "$results" "map(select(.variant == \"$v\")) | length" 1
  log_ok "$results" "map(select(.variant == \"$v\"))[0] | .steps == 2 and .model_state_bytes_predicted > 0
                     and (.model_state_bytes | length) == .world_size and (.model_state_bytes | max) == .model_state_bytes_predicted" \
    "$v: measured model state $(jq -sc "map(select(.variant == \"$v\"))[0].model_state_bytes" "$results"), planner $(jq -s "map(select(.variant == \"$v\"))[0].model_state_bytes_predicted" "$results")"
  grep -q "^$v " "$work/suite/table.txt" || fail "no row for $v in the table"
done
