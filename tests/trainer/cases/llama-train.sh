# fsdp-train --model llama: the GPT's equivalence and resume cases for the
# Llama. Every strategy at W = 2, and at W = 3 (padded units: a decoder
# layer's 49280 elements do not divide by 3) and W = 4 (the hybrids on 2
# simulated nodes), trains what one process does with the same global batch
# (1e-5 relative over 6 steps); --wrap sublayer, --sharded-init and
# activation checkpointing change nothing (bit for bit); a sharded
# checkpoint at step 3 resumes to the uninterrupted run bit for bit. That
# the model computes what transformers' LlamaForCausalLM does is
# LlamaModel.* (unit_tests) and the Hugging Face cases'.
make_text_data
model=(--model llama --preset tiny --data "$work/data.txt")
train_run w1 1 "${model[@]}" --steps 6 --batch 12
json_is "$work/w1.json" '[.model, .units] | @csv' '"llama",3'
for strategy in full_shard shard_grad_op zero1 no_shard; do
  train_run "w2-$strategy" 2 "${model[@]}" --steps 6 --batch 6 --strategy "$strategy"
  compare_losses "$work/w2-$strategy.jsonl" "$work/w1.jsonl" 1e-5 6
done
train_run w3 3 "${model[@]}" --steps 6 --batch 4
compare_losses "$work/w3.jsonl" "$work/w1.jsonl" 1e-5 6
for strategy in hybrid_shard hybrid_shard_zero2; do
  train_run "w4-$strategy" 4 --ranks-per-node 2 -- "${model[@]}" --steps 6 --batch 3 --strategy "$strategy"
  json_is "$work/w4-$strategy.json" '[.shard_group_size, .replicate_group_size] | @csv' "2,2"
  compare_losses "$work/w4-$strategy.jsonl" "$work/w1.jsonl" 1e-5 6
done

# The unit choices and sharded initialization: the same model, bit for bit.
train_run variants 2 "${model[@]}" --steps 6 --batch 6 --wrap sublayer --sharded-init --activation-checkpointing
json_is "$work/variants.json" .units 5
same_losses "$work/variants.jsonl" "$work/w2-full_shard.jsonl" 6

# Resume: saved at step 3, continued to 6: the uninterrupted run bit for bit.
train_run resumed 2 "${model[@]}" --steps 3 --batch 6 --ckpt-dir "$work/ck"
train_run resumed 2 "${model[@]}" --steps 6 --batch 6 --ckpt-dir "$work/ck" --resume --sample 16
json_is "$work/resumed.json" '[.first_step, .resumed_from] | @csv' "3,\"$work/ck/step-3\""
require_step_numbers "$work/resumed.jsonl" 1 6
same_losses "$work/resumed.jsonl" "$work/w2-full_shard.jsonl" 6
grep -q "== sample (16 tokens" "$work/resumed.out" || fail "--sample printed no sample"
# (A GPT run resuming a Llama's checkpoint: the bad-input table's other_family_resumed.)
expect_error "--kv-heads needs --model llama" "$run" -n 1 -- "$train" --preset tiny --kv-heads 2
expect_error "must be a multiple of kv_heads" "$run" -n 1 -- "$train" --model llama --preset tiny --kv-heads 3
expect_error "--model must be gpt or llama" "$run" -n 1 -- "$train" --model bert --preset tiny
first=$(losses "$work/w1.jsonl" | head -1); last=$(losses "$work/w1.jsonl" | tail -1)
echo "llama tiny: losses $first -> $last over 6 steps; every strategy equal to W = 1"
