#!/usr/bin/env bash
# ctest qlora_bnb_folder: a -bnb-4bit folder made by transformers and
# bitsandbytes (bnb_reference.py) in and out of QLoRA:
#   1. fsdp-train on 2 ranks reads it with --base-dtype nf4 (each rank its
#      shards' blocks, dequantized as bitsandbytes does and quantized again),
#      trains LoRA adapters 3 steps and saves a sharded checkpoint and the
#      adapters (--save-format peft);
#   2. the checkpoint's NF4 records are the folder's codes and absmax byte for byte;
#   3. PEFT loads our adapters on that same folder (bitsandbytes' 4-bit
#      forward) and gives the logits of our merged export (--merge-lora of
#      the folder read in fp32) within 1e-5, computing in fp32;
#   4. the refusals: FP4, 8-bit, another quant_method.
#   bnb_folder.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" source="$2"
source "$source/tests/python_refs_lib.sh"
require_python torch transformers peft bitsandbytes
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
ref=("$python" "$source/tests/qlora/bnb_reference.py")
tokens="$(seq -s, 3 9 200)"
lora=("$build/fsdp-run" -n 2 -- "$build/fsdp-train" --model llama --init-from "$work/bnb" --batch 2 --val-fraction 0
      --lora-rank 4 --lora-alpha 8 --lora-targets all-linear)
train=("${lora[@]}" --base-dtype nf4)

echo "== 1. transformers' random Llama, saved 4-bit by bitsandbytes; 3 QLoRA steps on 2 ranks"
"${ref[@]}" make "$work" 2> >(grep -v kernels-community >&2)
"${train[@]}" --steps 3 --lr 1e-2 --ckpt-dir "$work/ckpt" --save-final "$work/adapters" \
  --save-format peft > "$work/train.log"
# The merge reads the folder in fp32 (its codes dequantized, its other tensors as stored): PEFT's fp32 model.
# (--base-dtype nf4 would hold the embeddings, norms and head in bf16, rounding this fp32 folder's.)
"${lora[@]}" --init-from-adapter "$work/adapters" --steps 0 --save-final "$work/merged" --save-format hf \
  --merge-lora --save-dtype fp32 > "$work/merge.log"
"$build/fsdp-ckpt" logits "$work/merged" --tokens "$tokens" > "$work/ours.json"

echo "== 2. the NF4 records against the folder's bytes; 3. PEFT on the 4-bit folder with our adapters"
"${ref[@]}" records "$work/ckpt/step-3" "$work/bnb" + peft-compare "$work/bnb" "$work/adapters" "$work/ours.json" \
  2> >(grep -v kernels-community >&2)

echo "== 4. refusals"
refused() {  # refused FIELD JQ-EDIT: config.json edited so, fsdp-train must refuse it naming FIELD
  rm -rf "$work/edited" && cp -r "$work/bnb" "$work/edited"
  jq "$2" "$work/bnb/config.json" > "$work/edited/config.json"
  if "${train[@]/$work\/bnb/$work/edited}" --steps 1 > "$work/refused.log" 2>&1; then
    echo "FAIL: $1 was accepted"; exit 1
  fi
  grep -q "$1" "$work/refused.log" || { echo "FAIL: the refusal does not name $1:"; tail -3 "$work/refused.log"; exit 1; }
  echo "refused: $(grep -m1 -o "\"quantization_config[^;]*" "$work/refused.log")"
}
refused quantization_config.bnb_4bit_quant_type '.quantization_config.bnb_4bit_quant_type = "fp4"'
refused quantization_config.load_in_8bit '.quantization_config.load_in_8bit = true'
refused quantization_config.quant_method '.quantization_config.quant_method = "gptq"'
echo "qlora_bnb_folder: passed"
