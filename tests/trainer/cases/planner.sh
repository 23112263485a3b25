# fsdp-plan --json against real runs: the model state to the byte, split
# into parameters, gradients and optimizer state as the allocator counts
# them (with LoRA and --freeze too: the frozen parts' parameter bytes alone); the peak within 8%, the README's figure (measured: within 5.6%, the
# worst being tiny, full_shard), and equal to the trainer's own
# prediction; the host memory the trainer's preflight asked for equal to
# fsdp-plan's (one plan, fsdp::plan_run, for all three; a Llama too, and a
# hub model's config.json with the switches of its family, through
# --init-from); the textbook 70B table; a recommendation for a budget; a
# calibrated step-time estimate; at GPT-2's vocabulary, the loss computed
# in slices (models::next_token_loss), fp32 and bf16. Medium runs at batch 1 (two steps, the
# second with the optimizer state and prefetch in place, in ~10 s); large is
# not run.
plan="$build/fsdp-plan"

# A model downloaded from the hub, as fsdp-plan --init-from and fsdp-train
# --init-from read it: a Qwen3-style config.json with the switches that
# change the units' sizes (the head tied to the embedding, biases on q, k, v
# and o, per-head q/k norms, a head_dim of 24 where width / heads is 16),
# and weights of its layout in Hugging Face's names (zeros: the runs below
# measure memory).
mkdir -p "$work/qwen3"
cat > "$work/qwen3/config.json" <<'EOF'
{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 256, "hidden_size": 64,
 "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 24, "max_position_embeddings": 128, "attention_bias": true, "tie_word_embeddings": true,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0}
EOF
zero_safetensors "$work/qwen3/model.safetensors" "$(jq -c '
  .hidden_size as $c | .head_dim as $d | (.num_attention_heads * $d) as $q | (.num_key_value_heads * $d) as $kv
  | .intermediate_size as $h
  | {"model.embed_tokens.weight": [.vocab_size, $c], "model.norm.weight": [$c]}
    + ([range(.num_hidden_layers) | "model.layers.\(.)." as $p | {
         ($p + "input_layernorm.weight"): [$c], ($p + "post_attention_layernorm.weight"): [$c],
         ($p + "self_attn.q_proj.weight"): [$q, $c], ($p + "self_attn.q_proj.bias"): [$q],
         ($p + "self_attn.k_proj.weight"): [$kv, $c], ($p + "self_attn.k_proj.bias"): [$kv],
         ($p + "self_attn.v_proj.weight"): [$kv, $c], ($p + "self_attn.v_proj.bias"): [$kv],
         ($p + "self_attn.o_proj.weight"): [$c, $q], ($p + "self_attn.o_proj.bias"): [$c],
         ($p + "self_attn.q_norm.weight"): [$d], ($p + "self_attn.k_norm.weight"): [$d],
         ($p + "mlp.gate_proj.weight"): [$h, $c], ($p + "mlp.up_proj.weight"): [$h, $c],
         ($p + "mlp.down_proj.weight"): [$c, $h]}] | add)' "$work/qwen3/config.json")"

for cfg in "tiny 2 full_shard" "tiny 4 zero1" "small 2 no_shard" "small 2 full_shard --activation-checkpointing" \
           "small 2 full_shard --activation-checkpointing --wrap sublayer" "tiny 2 zero1 --param-dtype bf16" \
           "medium 2 full_shard --batch 1" "small 2 full_shard --model llama --activation-checkpointing" \
           "small 2 full_shard --model llama --init-from $work/qwen3 --batch 2" \
           "tiny 2 full_shard --lora-rank 4 --lora-targets all-linear" "tiny 2 zero1 --param-dtype bf16 --freeze wte|h\.0\." \
           "tiny 2 full_shard --vocab 50304 --batch 8" "tiny 2 zero1 --param-dtype bf16 --vocab 50304 --batch 8"; do
  read -r preset world strategy extra <<<"$cfg"
  train_run s "$world" --preset "$preset" --steps 2 --strategy "$strategy" $extra
  "$plan" --preset "$preset" --world "$world" --strategy "$strategy" $extra --json > "$work/plan.json" ||
    fail "$cfg: fsdp-plan --json failed"
  # Every rank's measured figure equals the planned one, for the total and each kind.
  jq -e --slurpfile s "$work/s.json" '.strategies[0] as $p | $s[0] as $m
      | ($m.model_state_bytes | unique) == [$p.model_state_bytes]
      and ($m.model_state_bytes_by_kind.params | unique) == [$p.params_bytes]
      and ($m.model_state_bytes_by_kind.grads | unique) == [$p.grads_bytes]
      and ($m.model_state_bytes_by_kind.optimizer | unique) == [$p.optimizer_bytes]
      and $p.model_state_bytes == $p.params_bytes + $p.grads_bytes + $p.optimizer_bytes' "$work/plan.json" >/dev/null ||
    fail "$cfg: measured $(jq -c '[.model_state_bytes, .model_state_bytes_by_kind]' "$work/s.json"), planned $(jq -c '.strategies[0]' "$work/plan.json")"
  # The trainer's prediction is the planner's device total; the measured peak is within 8% of it.
  jq -e --slurpfile s "$work/s.json" '.strategies[0].device_total_bytes as $p | $s[0] as $m
      | $m.peak_tensor_bytes_predicted == $p
      and (($p - ($m.peak_tensor_bytes | max)) / ($m.peak_tensor_bytes | max) | fabs) < 0.08' "$work/plan.json" >/dev/null ||
    fail "$cfg: peak measured $(jq -c .peak_tensor_bytes "$work/s.json"), trainer predicted $(jq .peak_tensor_bytes_predicted "$work/s.json"), planned $(jq .strategies[0].device_total_bytes "$work/plan.json")"
  jq -e --slurpfile s "$work/s.json" '.strategies[0].preflight_bytes == $s[0].ram_bytes_predicted' "$work/plan.json" >/dev/null ||
    fail "$cfg: the trainer's preflight asked for $(jq .ram_bytes_predicted "$work/s.json") B a rank, fsdp-plan plans $(jq .strategies[0].preflight_bytes "$work/plan.json")"
  # Fine-tuning: the parameters that train, and the frozen ones' bytes apart (parameter bytes only).
  jq -e --slurpfile s "$work/s.json" '.model.parameters == $s[0].parameters
      and .model.trainable_parameters == $s[0].trainable_parameters
      and ((.model.frozen_unit_numels | length > 0) == (.model.fine_tuning != null))
      and ((.strategies[0].frozen_params_bytes > 0) == (.model.fine_tuning != null))' "$work/plan.json" >/dev/null ||
    fail "$cfg: trainer's parameters $(jq -c '[.parameters, .trainable_parameters]' "$work/s.json"), planned $(jq -c '.model | [.parameters, .trainable_parameters, .frozen_unit_numels]' "$work/plan.json")"
  echo "ok: $cfg: model state $(jq '.strategies[0].model_state_bytes' "$work/plan.json") B as planned;" \
       "peak $(jq '.peak_tensor_bytes | max' "$work/s.json") B measured, $(jq .strategies[0].device_total_bytes "$work/plan.json") B planned"
done

# --init-from reads config.json alone: the folder, its model.safetensors and
# the file itself plan the same model, every switch named in its
# configuration; without --preset, at the batch of fsdp-train's default
# preset (small: 8), as fsdp-train --init-from trains it.
for from in "$work/qwen3" "$work/qwen3/model.safetensors" "$work/qwen3/config.json"; do
  "$plan" --model llama --init-from "$from" --world 2 --json > "$work/from.json" || fail "fsdp-plan --init-from $from failed"
  jq -e --arg from "$from" '.inputs.init_from == $from and .inputs.batch == 8 and .inputs.context == 128
         and (.model.config | test("tie_word_embeddings 1, attention_bias 1, qk_norm 1, head_dim 24, hub_family qwen3"))' \
    "$work/from.json" >/dev/null || fail "--init-from $from planned $(jq -c '[.inputs, .model.config]' "$work/from.json")"
  [ -z "${unit_numels:-}" ] || [ "$(jq -c .model.unit_numels "$work/from.json")" = "$unit_numels" ] ||
    fail "--init-from $from planned units $(jq -c .model.unit_numels "$work/from.json"), not $unit_numels"
  unit_numels=$(jq -c .model.unit_numels "$work/from.json")
done
echo "ok: --init-from's folder, weights and config.json plan the same units $unit_numels"
expect_error "holds a llama model: pass --model llama" "$plan" --init-from "$work/qwen3"
expect_error "--width 128 contradicts --init-from" "$plan" --model llama --init-from "$work/qwen3" --width 128
expect_error "give --preset or --params (with --layers), not both; or --init-from" "$plan" --params 1e9 --layers 4 \
  --model llama --init-from "$work/qwen3"

# The plan's own arithmetic: the device total is the sum of its parts, the
# budget's figure the model state plus at most the gathered bytes, and the
# inputs are echoed back.
"$plan" --preset medium --world 4 --nodes 2 --json > "$work/medium.json" || fail "medium plan failed"
jq -e '[.strategies[] | .device_total_bytes == .model_state_bytes + .gathered_bytes + .activations_bytes + .backward_transient_bytes
         and .needed_bytes >= .model_state_bytes and .needed_bytes <= .model_state_bytes + .gathered_bytes
         and .comm_bytes.total == .comm_bytes.all_gather + .comm_bytes.reduce_scatter + .comm_bytes.all_reduce
         and .host_bytes == 0] | all' "$work/medium.json" >/dev/null || fail "a strategy's figures do not add up"
jq -e '[.strategies[].strategy] == ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2"]
       and .inputs.world == 4 and .inputs.nodes == 2 and .inputs.ranks_per_node == 2 and .inputs.preset == "medium"
       and .model.parameters == (.model.unit_numels | add) and .recommendation == null and .cluster == null' \
  "$work/medium.json" >/dev/null || fail "medium plan: strategies, inputs or model wrong"
"$plan" --preset medium --world 2 --offload cpu --json > "$work/offload.json" || fail "offload plan failed"
jq -e '[.strategies[] | .host_bytes == .model_state_bytes and .device_total_bytes == .gathered_bytes + .activations_bytes + .backward_transient_bytes] | all' \
  "$work/offload.json" >/dev/null || fail "offload does not move the model state to the host"

# The textbook table for 70B on 8 devices (bf16 parameters and gradients).
"$plan" --params 70e9 --layers 80 --width 8192 --world 8 --param-dtype bf16 --seed-accounting --json > "$work/70b.json" ||
  fail "70B plan failed"
jq -e '.model.parameters == 70000000000 or (.model.parameters - 70e9 | fabs) < 100' "$work/70b.json" >/dev/null ||
  fail "the 70B plan has $(jq .model.parameters "$work/70b.json") parameters"
jq -e '.seed_accounting as $t
       | ($t[] | select(.layout == "ddp" and .optimizer_bytes_per_param == 4) | [.params_bytes, .grads_bytes, .optimizer_bytes, .total_bytes] | map(. / 1e8 | round))
         == [1400, 1400, 2800, 5600]
       and ($t[] | select(.layout == "fsdp" and .optimizer_bytes_per_param == 12) | [.params_bytes, .grads_bytes, .optimizer_bytes, .total_bytes] | map(. / 1e8 | round))
         == [175, 175, 1050, 1400]' "$work/70b.json" >/dev/null || { jq -c .seed_accounting "$work/70b.json" >&2; fail "wrong textbook rows"; }

# --budget: the first strategy, from least to most communication, whose
# model state plus gathered parameters fits (auto.sh holds fsdp-train
# --strategy auto to the same answers). A budget of exactly a strategy's
# need picks it.
args=(--preset small --world 2 --param-dtype bf16)
"$plan" "${args[@]}" --json > "$work/small.json" || fail "small plan failed"
for strategy in no_shard zero1 shard_grad_op full_shard; do
  need=$(jq --arg s "$strategy" '.strategies[] | select(.strategy == $s) | .needed_bytes' "$work/small.json")
  "$plan" "${args[@]}" --budget "$need" --json > "$work/b.json" || fail "plan with --budget $need failed"
  [ "$(jq -r .recommendation.strategy "$work/b.json")" = "$strategy" ] &&
    jq -e '.inputs.budget_bytes == .recommendation.budget_bytes
           and ([.recommendation.candidates[] | select(.fits)][0].strategy == .recommendation.strategy)
           and ([.recommendation.candidates[] | .fits == (.needed_bytes <= $b)] | all)
           and [.recommendation.candidates[].strategy] == ["no_shard", "zero1", "shard_grad_op", "full_shard"]' \
      --argjson b "$need" "$work/b.json" >/dev/null || { jq -c .recommendation "$work/b.json" >&2; fail "a budget of $need did not pick $strategy"; }
  # The candidates' figures are the strategies' own.
  jq -e --slurpfile all "$work/small.json" '[.recommendation.candidates[] as $c | $all[0].strategies[] | select(.strategy == $c.strategy)
         | .needed_bytes == $c.needed_bytes and .comm_bytes.total == $c.comm_bytes] | length == 4 and all' "$work/b.json" >/dev/null ||
    fail "the recommendation's candidates differ from the strategies' figures"
  # The text output prints the same reason.
  "$plan" "${args[@]}" --budget "$need" | grep -F -- "$(jq -r .recommendation.reason "$work/b.json")" > /dev/null ||
    fail "the text output lacks the JSON's reason"
  echo "ok: --budget $need picks $strategy"
done
least=$(jq '[.strategies[].needed_bytes] | min' "$work/small.json")
"$plan" "${args[@]}" --budget $((least - 1)) --json > "$work/none.json" || fail "plan with a budget nothing fits failed"
jq -e '.recommendation.strategy == null and ([.recommendation.candidates[].fits] | any | not)' "$work/none.json" >/dev/null ||
  fail "a budget below every need recommended $(jq .recommendation.strategy "$work/none.json")"
grep -qF "no strategy fits a per-rank budget of $((least - 1)) B" <<<"$(jq -r .recommendation.reason "$work/none.json")" ||
  fail "no reason why nothing fits: $(jq -r .recommendation.reason "$work/none.json")"

# A calibrated cluster: a step-time estimate per strategy.
"$run" -n 2 -- "$plan" calibrate > "$work/cluster.json" 2>"$work/cal.err" || { cat "$work/cal.err"; fail "calibrate failed"; }
jq -e '.flops > 0 and .intra_node_bandwidth > 0' "$work/cluster.json" >/dev/null || fail "calibration wrote no figures"
"$plan" --preset medium --world 2 --cluster "$work/cluster.json" --json > "$work/timed.json" || fail "plan with --cluster failed"
jq -e '.cluster.compute_s > 0 and ([.cluster.strategies[] | .step_s >= $c and .scaling_efficiency > 0 and .scaling_efficiency <= 1
         and (.step_s * .scaling_efficiency - $c | fabs) < 1e-9 * $c] | all) and (.cluster.strategies | length) == 4' \
  --argjson c "$(jq .cluster.compute_s "$work/timed.json" 2>/dev/null || echo 0)" "$work/timed.json" >/dev/null ||
  { jq -c .cluster "$work/timed.json" >&2; fail "no step-time estimate"; }

# The disk, measured where offloading would write: both ranks at once,
# through the engine the store chooses; the scratch files are gone after.
mkdir -p "$work/disk"
"$run" -n 2 -- "$plan" calibrate --offload-dir "$work/disk" --disk-mib 64 > "$work/disk.json" 2>"$work/disk.err" ||
  { cat "$work/disk.err"; fail "calibrate --offload-dir failed"; }
jq -e '.disk_write_bandwidth > 0 and .disk_read_bandwidth > 0 and .disk.bytes_per_rank == 67108864
       and (.disk.engine | test("^(libaio|threads)"))' "$work/disk.json" >/dev/null ||
  { cat "$work/disk.json" >&2; fail "calibrate --offload-dir wrote no disk figures"; }
[ -z "$(ls -A "$work/disk")" ] || fail "calibrate left scratch files: $(ls "$work/disk")"
expect_error "cannot use the folder '$work/nowhere'" "$run" -n 2 -- "$plan" calibrate --offload-dir "$work/nowhere"

expect_error "give --preset or --params" "$plan" --world 2
expect_error "--offload must be none, cpu, nvme or nvme-optimizer" "$plan" --preset tiny --offload disk
expect_error "cannot be combined with --offload cpu" "$plan" --preset tiny --offload cpu --budget 1e9
