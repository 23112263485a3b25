#!/usr/bin/env bash
# ctest hugging_face_gpt2 / hugging_face_llama: Hugging Face weights in and out
# against the `transformers` package (PyPI), with no hub access:
#   1. transformers builds a small random model (seeded) and save_pretrained's it;
#      `fsdp-ckpt logits` of that folder equals transformers' logits within 1e-5 (fp32);
#   2. fsdp-train on 2 ranks starts from that folder (--init-from, each rank
#      reading its own shards) and saves --save-format hf (streamed from the
#      gathered units, in the source's dtype: BF16 for mistral's; in shards
#      of 100 KB with an index for qwen2's, its chat template carried over);
#      from_pretrained loads the folder with no missing or unexpected keys
#      and gives fsdp-cpp's logits within 1e-5;
#   3. conversions round trip bit for bit: hf -> spec -> hf, and the trained
#      spec file -> hf -> spec (every tensor equal), checkpoint -> hf
#      (--source-model: the same dtype, shards and files as the trainer's).
# The python is $FSDP_TEST_PYTHON, else the checkout's .venv; without it, or
# without transformers, exit 77 (skipped) unless CI is set.
#   run.sh BUILD_DIR SOURCE_DIR gpt2|llama|llama3|mistral|qwen2|qwen3|phi3
# (the last five: reference.py's FAMILIES, the hub's Llama-like families with
# the config features each ships: tied embeddings, llama3 and linear rope
# scaling, a sliding window, q/k/v biases, q/k norms and an explicit head_dim,
# Phi-3's fused projections)
set -euo pipefail
build="$1" source="$2" kind="$3"
source "$source/tests/python_refs_lib.sh"
require_python torch transformers
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
ref=("$python" "$source/tests/hugging_face/reference.py")
ckpt="$build/fsdp-ckpt"
tokens="$(seq -s, 3 9 290)"  # 32 tokens, the models' context
model_flag=(--model gpt)
[ "$kind" = gpt2 ] || model_flag=(--model llama)  # the Llama-like families are the library's Llama with switches

# transformers runs twice (importing it is most of a run): first it makes the
# model (and the hub's forms of it), then it checks everything fsdp-cpp made.
echo "== 1. transformers' $kind in"
made=(make "$kind" "$work/hf")
[ "$kind" = gpt2 ] && made+=(+ hub "$work/hf" "$work/hub")
"${ref[@]}" "${made[@]}" 2>/dev/null
"$ckpt" logits "$work/hf" --tokens "$tokens" > "$work/hf.json"
export_flags=()
if [ "$kind" = qwen2 ]; then  # the hub's chat template files, carried into the export; and shards out
  echo '{% for m in messages %}{{ m.content }}{% endfor %}' > "$work/hf/chat_template.jinja"
  echo '{"model_max_length": 32, "chat_template": null}' > "$work/hf/tokenizer_config.json"
  export_flags=(--hf-shard-size 100KB)
fi

echo "== 2. trained on 2 ranks from it, exported"
"$build/fsdp-run" -n 2 -- "$build/fsdp-train" "${model_flag[@]}" --init-from "$work/hf" --steps 3 --batch 2 \
  --lr 1e-2 --val-fraction 0 --ckpt-dir "$work/ck" --save-final "$work/trained" --save-format hf \
  "${export_flags[@]}" > "$work/train.log"
"$ckpt" logits "$work/trained" --tokens "$tokens" > "$work/trained.json"
! cmp -s "$work/hf.json" "$work/trained.json" || { echo "training changed no logit"; exit 1; }
jq -e --arg dtype "$([ "$kind" = mistral ] && echo bfloat16 || echo float32)" '.dtype == $dtype' \
  "$work/trained/config.json" > /dev/null || { echo "the export's dtype is not the source's"; exit 1; }
jq -e '.bos_token_id == 1 or .bos_token_id == 299' "$work/trained/config.json" > /dev/null ||
  { echo "the export lost the source's token ids"; exit 1; }
if [ "$kind" = qwen2 ]; then
  [ -f "$work/trained/model.safetensors.index.json" ] && [ ! -e "$work/trained/model.safetensors" ] ||
    { echo "--hf-shard-size 100KB wrote no shards"; ls "$work/trained"; exit 1; }
  cmp "$work/hf/chat_template.jinja" "$work/trained/chat_template.jinja"
  cmp "$work/hf/tokenizer_config.json" "$work/trained/tokenizer_config.json"
fi

echo "== 3. conversions"
"$ckpt" convert "$work/hf" "$work/hf.spec.safetensors" --format spec > /dev/null
"$ckpt" convert "$work/hf.spec.safetensors" "$work/hf2" --format hf > /dev/null
"$ckpt" convert "$work/trained" "$work/trained.spec.safetensors" --format spec > /dev/null
"$ckpt" convert "$work/trained.spec.safetensors" "$work/trained2" --format hf > /dev/null
"$ckpt" convert "$work/trained2" "$work/trained2.spec.safetensors" --format spec > /dev/null
checkpoint="$(ls -d "$work"/ck/step-* | tail -1)"
"$ckpt" convert "$checkpoint" "$work/from_ckpt" --format hf --source-model "$work/hf" "${export_flags[@]}" > /dev/null

# hf -> spec -> hf writes F32 in one file: bit for bit against a made folder
# of one F32 file; the sharded (qwen2) and BF16 (mistral) ones, by their logits.
made_again=(same "$work/hf/model.safetensors" "$work/hf2/model.safetensors")
case "$kind" in qwen2|mistral) made_again=(compare "$work/hf2" "$work/hf.json") ;; esac
echo "== 1-3 checked by transformers: its model's logits, the trained export loaded back, conversions bit for bit"
"${ref[@]}" compare "$work/hf" "$work/hf.json" \
  + compare "$work/trained" "$work/trained.json" \
  + "${made_again[@]}" \
  + same "$work/trained.spec.safetensors" "$work/trained2.spec.safetensors" \
  + same "$work/trained" "$work/from_ckpt" \
  + compare "$work/from_ckpt" "$work/trained.json"
expect_error() {  # expect_error MESSAGE COMMAND...: fails unless COMMAND fails saying MESSAGE
  local message="$1" out; shift
  if out="$("$@" 2>&1)"; then echo "expected an error: $*"; exit 1; fi
  grep -qF -- "$message" <<< "$out" || { echo "expected '$message' from $*, got: $out"; exit 1; }
}
# with_config NAME JQ: the made model's folder as NAME, its config.json changed by the jq filter.
with_config() {
  mkdir -p "$work/$1" && cp "$work/hf/"*.safetensors* "$work/$1/"
  jq "$2" "$work/hf/config.json" > "$work/$1/config.json"
}
if [ "$kind" = mistral ]; then
  echo "== 4. a sliding window shorter than the sequence is refused, naming both"
  with_config window16 '.sliding_window = 16'
  expect_error "sequence length 32 exceeds the sliding window of 16" "$ckpt" logits "$work/window16" --tokens "$tokens"
fi
if [ "$kind" = llama3 ]; then
  echo "== 4. rope scaling the model does not compute is refused by name"
  with_config yarn '.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}'
  expect_error 'rope scaling of type "yarn" is not supported' "$ckpt" logits "$work/yarn" --tokens 1
fi
[ "$kind" = gpt2 ] || { echo "ok: $kind in and out"; exit 0; }

echo "== 4. GPT-2 as the hub serves it (no transformer. prefix, BF16), and what is refused"
"$ckpt" logits "$work/hub" --tokens "$tokens" | cmp - "$work/hf.json"
"$ckpt" logits "$work/hub/bf16.safetensors" --tokens "$tokens" > /dev/null
expect_error '"activation_function" is "relu"' "$ckpt" logits "$work/hub-relu" --tokens 1
expect_error '"layer_norm_epsilon" is 1e-06' "$ckpt" logits "$work/hub-eps" --tokens 1
expect_error '"tie_word_embeddings" is false' "$ckpt" logits "$work/hub-untied" --tokens 1
expect_error 'has no "weight_map"' "$ckpt" logits "$work/hub-sharded" --tokens 1
train=("$build/fsdp-run" -n 1 -- "$build/fsdp-train" --steps 1)
expect_error "holds a gpt model: pass --model gpt" "${train[@]}" --model llama --init-from "$work/hub"
expect_error "--width 128 contradicts --init-from" "${train[@]}" --init-from "$work/hub" --width 128
echo "ok: $kind in and out"
