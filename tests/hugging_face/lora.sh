#!/usr/bin/env bash
# ctest hugging_face_lora_llama / hugging_face_lora_gpt2: LoRA adapters in and
# out of PEFT's folders against the `peft` package (PyPI), with no hub access:
#   1. transformers makes a small random base model (reference.py make), and
#      PEFT its own adapters on it (get_peft_model, A and B random, B not zero;
#      save_pretrained);
#   2. fsdp-train on 2 ranks trains adapters of its own on that base and saves
#      them with --save-format peft; then, with --steps 0 (no training: the
#      model as loaded), reads them back with --init-from-adapter and writes
#      the merged model (--merge-lora --save-format hf). PEFT's
#      PeftModel.from_pretrained(base, our adapters) gives the logits of our
#      merged model (fsdp-ckpt logits) within 1e-5, and transformers loads the
#      merged folder as a plain model (no missing or unexpected keys) with
#      the same logits;
#   3. PEFT's adapters read with --init-from-adapter: written out again
#      (--save-format peft) they are PEFT's tensors bit for bit; merged, they
#      give PEFT's logits within 1e-5 (our merge of its adapters, and
#      from_pretrained of that merge).
#   run.sh BUILD_DIR SOURCE_DIR llama|gpt2
# The python is $FSDP_TEST_PYTHON, else the checkout's .venv; without it, or
# without peft, exit 77 (skipped) unless CI is set.
set -euo pipefail
build="$1" source="$2" kind="$3"
source "$source/tests/python_refs_lib.sh"
require_python torch transformers peft
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
ref=("$python" "$source/tests/hugging_face/reference.py")
ckpt="$build/fsdp-ckpt"
tokens="$(seq -s, 3 9 290)"  # 32 tokens, the models' context
case "$kind" in
  gpt2) model_flag=(--model gpt) targets=c_attn,c_proj ;;  # GPT-2's Conv1D: fan_in_fan_out
  llama) model_flag=(--model llama) targets=q_proj,v_proj,down_proj ;;
  *) echo "lora.sh: unknown kind '$kind' (expected llama or gpt2)"; exit 2 ;;
esac
train=("$build/fsdp-run" -n 2 -- "$build/fsdp-train" "${model_flag[@]}" --init-from "$work/hf" --batch 2
       --val-fraction 0)

echo "== 1. transformers' $kind and PEFT's adapters on it"
"${ref[@]}" make "$kind" "$work/hf" + peft-make "$work/hf" "$targets" "$work/peft" 2>/dev/null

echo "== 2. adapters trained on 2 ranks, saved for PEFT, read back and merged"
"${train[@]}" --lora-rank 4 --lora-alpha 8 --lora-targets "$targets" --steps 3 --lr 1e-2 \
  --save-final "$work/trained" --save-format peft > "$work/train.log"
"${train[@]}" --init-from-adapter "$work/trained" --steps 0 --save-final "$work/trained-merged" --save-format hf \
  --merge-lora > "$work/merge.log"
"$ckpt" logits "$work/trained-merged" --tokens "$tokens" > "$work/trained.json"
"$ckpt" logits "$work/hf" --tokens "$tokens" > "$work/hf.json"
! cmp -s "$work/hf.json" "$work/trained.json" || { echo "the trained adapters changed no logit"; exit 1; }
jq -e --arg base "$work/hf" --argjson fan "$([ "$kind" = gpt2 ] && echo true || echo false)" \
  '.peft_type == "LORA" and .r == 4 and .lora_alpha == 8 and .base_model_name_or_path == $base
   and .fan_in_fan_out == $fan and .task_type == "CAUSAL_LM"' "$work/trained/adapter_config.json" > /dev/null ||
  { echo "adapter_config.json is not as expected:"; cat "$work/trained/adapter_config.json"; exit 1; }

echo "== 3. PEFT's adapters read, written again, merged"
"${train[@]}" --init-from-adapter "$work/peft" --steps 0 --save-final "$work/peft-again" --save-format peft \
  > "$work/again.log"
"${train[@]}" --init-from-adapter "$work/peft" --steps 0 --save-final "$work/peft-merged" --save-format hf \
  --merge-lora > "$work/peft-merge.log"
"$ckpt" logits "$work/peft-merged" --tokens "$tokens" > "$work/peft-merged.json"

echo "== 2-3 checked by PEFT and transformers"
"${ref[@]}" peft-compare "$work/hf" "$work/trained" "$work/trained.json" \
  + compare "$work/trained-merged" "$work/trained.json" \
  + same "$work/peft/adapter_model.safetensors" "$work/peft-again/adapter_model.safetensors" \
  + peft-compare "$work/hf" "$work/peft" "$work/peft-merged.json" \
  + compare "$work/peft-merged" "$work/peft-merged.json"
expect_error() {  # expect_error MESSAGE COMMAND...: fails unless COMMAND fails saying MESSAGE
  local message="$1" out; shift
  if out="$("$@" 2>&1)"; then echo "expected an error: $*"; exit 1; fi
  grep -qF -- "$message" <<< "$out" || { echo "expected '$message' from $*, got: $out"; exit 1; }
}
echo "== 4. PEFT features the adapters here do not have are refused by name"
mkdir -p "$work/dora" && cp "$work/peft/adapter_model.safetensors" "$work/dora/"
jq '.use_dora = true' "$work/peft/adapter_config.json" > "$work/dora/adapter_config.json"
expect_error '"use_dora" is true, but DoRA is not supported' "${train[@]}" --init-from-adapter "$work/dora" --steps 0 \
  --save-final "$work/x" --save-format peft
echo "ok: $kind's LoRA adapters in and out of PEFT"
