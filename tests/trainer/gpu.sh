#!/usr/bin/env bash
# On a GPU (skipped, exit 77, elsewhere): fsdp-train --device cuda at W = 1
# (a group of one: device copies, no NCCL) and W = 2 and 4 ranks sharing the one GPU (the MPI
# group, staging device tensors through host memory) train what W = 1 does
# (fp32, 1e-5 relative on every loss), and what the CPU trains (1e-4: other
# kernels, the same math); --offload cpu on the GPU trains what the GPU run
# without it does (1e-4: the optimizer steps on the CPU there) with a lower
# device peak.
source "$(dirname "$0")/lib.sh" "$@"
if ! nvidia-smi -L > /dev/null 2>&1; then echo "skipped: no GPU (nvidia-smi lists none)"; exit 77; fi

common=(--preset small --steps 20)
train_run cpu 1 "${common[@]}" --batch 4 --device cpu
train_run gpu-w1 1 "${common[@]}" --batch 4 --device cuda
json_is "$work/gpu-w1.json" .backend local
for ranks in 2 4; do
  train_run "gpu-w$ranks" "$ranks" "${common[@]}" --device cuda --batch $(( 4 / ranks ))
  json_is "$work/gpu-w$ranks.json" .backend mpi
  compare_losses "$work/gpu-w$ranks.jsonl" "$work/gpu-w1.jsonl" 1e-5 20
done
compare_losses "$work/gpu-w1.jsonl" "$work/cpu.jsonl" 1e-4 20
# Offload steps on the CPU with FusedAdamW, the GPU run with AdamW's CUDA
# kernels: another formula's rounding, hence 1e-4.
train_run gpu-offload 1 "${common[@]}" --batch 4 --device cuda --offload cpu
compare_losses "$work/gpu-offload.jsonl" "$work/gpu-w1.jsonl" 1e-4 20
json_ok "$work/gpu-offload.json" ".peak_device_bytes < $(summary "$work/gpu-w1.json" .peak_device_bytes)" \
  "offload did not lower the device peak"
echo "device peak: $(summary "$work/gpu-w1.json" .peak_device_bytes) B without offload, $(summary "$work/gpu-offload.json" .peak_device_bytes) B with"
pass
