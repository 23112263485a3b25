# The benchmark suite's PyTorch peers on tiny (bench/peer.py, the wheel's
# torch in .venv/ or FSDP_PYTHON): against an fsdp-cpp built on that same
# torch's LibTorch, the same model, data and initialization give the same
# final loss as fsdp-train at the same W and dtype (relative 1e-4), and
# every fsdp-cpp row gets its ratios to PyTorch DDP and FSDP2. Another
# LibTorch draws other initial weights from the same seed: against it the
# case is skipped, not passed.

python="${FSDP_PYTHON:-$here/../../.venv/bin/python}"
torch_dir=$("$python" -c 'import torch, os; print(os.path.realpath(os.path.dirname(torch.__file__)))' 2>/dev/null) ||
  skip "no PyTorch at $python (scripts/setup.sh wheel makes it)"
built_on=$(sed -n 's/^FSDP_LIBTORCH:PATH=//p' "$build/CMakeCache.txt")
[ -n "$built_on" ] && [ "$(realpath "$built_on")" = "$torch_dir" ] ||
  skip "this build's LibTorch (${built_on:-the system one}) is not PyTorch's at $torch_dir: other initial weights, nothing to compare"

ours="local no_shard full_shard full_shard_bf16 no_shard_w4 full_shard_w4"
peers="torch_local torch_ddp torch_fsdp1 torch_fsdp2 torch_fsdp2_bf16 torch_ddp_w4 torch_fsdp2_w4"
# shellcheck disable=SC2086
FSDP_BUILD="$build" FSDP_PYTHON="$python" "$here/../../bench/suite.sh" --preset tiny --steps 2 --out "$work/suite" \
  --variants "$(echo $ours $peers)" > "$work/suite.out" 2>&1 || { cat "$work/suite.out"; fail "the benchmark suite failed"; }
cat "$work/suite.out"
results="$work/suite/results.jsonl"
require_steps "$results" "$(wc -w <<<"$ours $peers")"
# peer_matches PEER OURS: the same final loss (relative 1e-4).
peer_matches() {
  log_ok "$results" "(map(select(.variant == \"$1\"))[0].final_loss) as \$a | (map(select(.variant == \"$2\"))[0].final_loss) as \$b
                     | ((\$a - \$b) | fabs) <= 1e-4 * (\$b | fabs)" \
    "$1 ended at loss $(jq -s "map(select(.variant == \"$1\"))[0].final_loss" "$results"), $2 at $(jq -s "map(select(.variant == \"$2\"))[0].final_loss" "$results")"
  echo "ok: $1 ends at $2's loss"
}
peer_matches torch_local local
for p in torch_ddp torch_fsdp1 torch_fsdp2; do peer_matches "$p" no_shard; done
peer_matches torch_fsdp2_bf16 full_shard_bf16
peer_matches torch_ddp_w4 no_shard_w4
peer_matches torch_fsdp2_w4 full_shard_w4
for p in $peers; do grep -q "^$p " "$work/suite/table.txt" || fail "no row for $p in the table"; done
# full_shard's row: time and RSS ratios to torch DDP and FSDP2, as numbers.
header=$(head -1 "$work/suite/table.txt")
for column in "time x torch DDP" "time x torch FSDP2" "RSS x torch DDP" "RSS x torch FSDP2"; do
  grep -qF "$column" <<<"$header" || fail "the table has no column '$column'"
done
awk '$1 == "full_shard" { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) n++; exit !(n >= 10) }' \
  "$work/suite/table.txt" || fail "full_shard's row lacks its ratios: $(grep '^full_shard ' "$work/suite/table.txt")"
