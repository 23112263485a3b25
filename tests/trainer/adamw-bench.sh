#!/usr/bin/env bash
# The AdamW benchmark's smoke case (bench/adamw.sh runs it at 100 M
# elements): it runs, both optimizers step the same shard to within 1e-6
# (norm-relative) over its steps, every parameter went through the fused
# pass, and the figures it reports are there.
source "$(dirname "$0")/lib.sh" "$@"
"$build/fsdp-bench-adamw" --elements 3000000 --rounds 3 > "$work/adamw.json" || fail "fsdp-bench-adamw failed"
cat "$work/adamw.json"
json_ok "$work/adamw.json" '.relative_difference < 1e-6' "FusedAdamW and torch::optim::AdamW differ by more than 1e-6"
json_ok "$work/adamw.json" '.fused_all == true' "FusedAdamW fell back to AdamW's step"
json_ok "$work/adamw.json" '(.fused_s > 0) and (.torch_s > 0) and (.speedup > 0) and (.fused_rounds_s | length == 3)' \
  "figures missing"
# Against ATen's own fused CPU AdamW where the LibTorch has it (2.x).
if [ "$(jq -r '.aten_fused_s // empty' "$work/adamw.json")" != "" ]; then
  json_ok "$work/adamw.json" '.aten_relative_difference < 1e-6 and .speedup_over_aten_fused > 0 and (.aten_fused_rounds_s | length == 3)' \
    "ATen's fused AdamW differs from torch::optim::AdamW by more than 1e-6, or its figures are missing"
else
  echo "note: this LibTorch has no at::_fused_adamw_: the comparison with it is not made"
fi
pass
