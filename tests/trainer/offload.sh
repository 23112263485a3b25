#!/usr/bin/env bash
# --offload cpu: the fp32 shards, their gradients and the optimizer state in
# host memory, the optimizer step on the CPU. On a CPU run that moves
# nothing, so the run must equal the one without offload step for step,
# exactly (the same operations in the same order), at W = 2 and 4, for the
# sharded strategies, with bf16 parameters too. Refusals, each naming what
# to do: offload where parameters stay whole, a GPU where there is none, NCCL
# without a GPU, unknown values. (The GPU cases are in gpu.sh.)
source "$(dirname "$0")/lib.sh" "$@"

common=(--preset tiny --steps 6)
for ranks in 2 4; do
  for strategy in full_shard shard_grad_op; do
    train_run "w$ranks-$strategy" "$ranks" "${common[@]}" --strategy "$strategy"
    train_run "w$ranks-$strategy-offload" "$ranks" "${common[@]}" --strategy "$strategy" --offload cpu
    json_is "$work/w$ranks-$strategy-offload.json" .offload cpu
    json_is "$work/w$ranks-$strategy.json" .offload none
    same_losses "$work/w$ranks-$strategy-offload.jsonl" "$work/w$ranks-$strategy.jsonl" 6
  done
done
train_run bf16 2 "${common[@]}" --param-dtype bf16 --reduce-dtype fp32
train_run bf16-offload 2 "${common[@]}" --param-dtype bf16 --reduce-dtype fp32 --offload cpu
same_losses "$work/bf16-offload.jsonl" "$work/bf16.jsonl" 6
json_is "$work/bf16-offload.json" .device cpu
json_is "$work/bf16-offload.json" .peak_device_bytes 0

expect_error "cpu_offload needs a sharded strategy" "$run" -n 2 -- "$train" --preset tiny --steps 1 --strategy no_shard --offload cpu
expect_error "--offload must be none or cpu, got 'nvme' (offload to disk: --offload-optimizer nvme" "$run" -n 1 -- "$train" --preset tiny --steps 1 --offload nvme
expect_error "--device must be cpu or cuda" "$run" -n 1 -- "$train" --preset tiny --steps 1 --device tpu
expect_error "--backend nccl needs --device cuda" "$run" -n 1 -- "$train" --preset tiny --steps 1 --backend nccl
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect_error "--device cuda:" "$run" -n 1 -- "$train" --preset tiny --steps 1 --device cuda
fi
pass
