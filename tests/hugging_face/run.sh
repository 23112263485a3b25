#!/usr/bin/env bash
# ctest hugging_face_gpt2 / hugging_face_llama: Hugging Face weights in and out
# against the `transformers` package (PyPI), with no hub access:
#   1. transformers builds a small random model (seeded) and save_pretrained's it;
#      `fsdp-ckpt logits` of that folder equals transformers' logits within 1e-5 (fp32);
#   2. fsdp-train on 2 ranks starts from that folder (--init-from) and saves
#      --save-format hf; from_pretrained loads the folder with no missing or
#      unexpected keys and gives fsdp-cpp's logits within 1e-5;
#   3. conversions round trip bit for bit: hf -> spec -> hf, and the trained
#      spec file -> hf -> spec (every tensor equal), checkpoint -> hf.
# The python is $FSDP_TEST_PYTHON, else the checkout's .venv; without it, or
# without transformers, exit 77 (skipped) unless CI is set.
#   run.sh BUILD_DIR SOURCE_DIR gpt2|llama
set -euo pipefail
build="$1" source="$2" kind="$3"
python="${FSDP_TEST_PYTHON:-$source/.venv/bin/python}"
skip() {
  echo "skipped: $1"
  [ -n "${CI:-}" ] && exit 1
  exit 77
}
[ -x "$python" ] || skip "no test python ($python; scripts/test.sh makes it)"
"$python" -c "import torch, transformers" 2>/dev/null || skip "$python lacks torch or transformers"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
ref=("$python" "$source/tests/hugging_face/reference.py")
ckpt="$build/fsdp-ckpt"
tokens="$(seq -s, 3 9 290)"  # 32 tokens, the models' context
model_flag=(--model gpt)
[ "$kind" = llama ] && model_flag=(--model llama)

echo "== 1. transformers' $kind in"
"${ref[@]}" make "$kind" "$work/hf" 2>/dev/null
"$ckpt" logits "$work/hf" --tokens "$tokens" > "$work/hf.json"
"${ref[@]}" compare "$work/hf" "$work/hf.json"

echo "== 2. trained on 2 ranks from it, exported, loaded back"
"$build/fsdp-run" -n 2 -- "$build/fsdp-train" "${model_flag[@]}" --init-from "$work/hf" --steps 3 --batch 2 \
  --lr 1e-2 --val-fraction 0 --ckpt-dir "$work/ck" --save-final "$work/trained" --save-format hf > "$work/train.log"
"$ckpt" logits "$work/trained" --tokens "$tokens" > "$work/trained.json"
! cmp -s "$work/hf.json" "$work/trained.json" || { echo "training changed no logit"; exit 1; }
"${ref[@]}" compare "$work/trained" "$work/trained.json"

echo "== 3. conversions bit for bit"
same() {  # two safetensors files hold the same tensors, bit for bit
  "$python" - "$1" "$2" <<'PY'
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
bad = [k for k in a if a[k].dtype != b[k].dtype or not a[k].equal(b[k])]
assert not bad, f"differ: {bad}"
print(f"  {len(a)} tensors equal: {sys.argv[1].split('/')[-2:]} and {sys.argv[2].split('/')[-2:]}")
PY
}
"$ckpt" convert "$work/hf" "$work/hf.spec.safetensors" --format spec > /dev/null
"$ckpt" convert "$work/hf.spec.safetensors" "$work/hf2" --format hf > /dev/null
same "$work/hf/model.safetensors" "$work/hf2/model.safetensors"
"$ckpt" convert "$work/trained" "$work/trained.spec.safetensors" --format spec > /dev/null
"$ckpt" convert "$work/trained.spec.safetensors" "$work/trained2" --format hf > /dev/null
"$ckpt" convert "$work/trained2" "$work/trained2.spec.safetensors" --format spec > /dev/null
same "$work/trained.spec.safetensors" "$work/trained2.spec.safetensors"
checkpoint="$(ls -d "$work"/ck/step-* | tail -1)"
"$ckpt" convert "$checkpoint" "$work/from_ckpt" --format hf > /dev/null
same "$work/trained/model.safetensors" "$work/from_ckpt/model.safetensors"
"${ref[@]}" compare "$work/from_ckpt" "$work/trained.json"
[ "$kind" = gpt2 ] || { echo "ok: $kind in and out"; exit 0; }

echo "== 4. GPT-2 as the hub serves it (no transformer. prefix, BF16), and what is refused"
"$python" - "$work/hf" "$work/hub" <<'PY'
import json, os, shutil, sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
tensors = {k.removeprefix("transformer."): v for k, v in load_file(f"{src}/model.safetensors").items()}
tensors.update({f"h.{i}.attn.bias": __import__("torch").ones(1, 1, 32, 32) for i in range(2)})  # old files' buffers
save_file(tensors, f"{dst}/model.safetensors", metadata={"format": "pt"})
shutil.copy(f"{src}/config.json", dst)
save_file({k: v.bfloat16() for k, v in tensors.items()}, f"{dst}/bf16.safetensors", metadata={"format": "pt"})
config = json.load(open(f"{src}/config.json"))
for name, change in {"relu": {"activation_function": "relu"}, "eps": {"layer_norm_epsilon": 1e-6},
                     "untied": {"tie_word_embeddings": False}}.items():
    os.makedirs(f"{dst}-{name}")
    shutil.copy(f"{dst}/model.safetensors", f"{dst}-{name}")
    json.dump({**config, **change}, open(f"{dst}-{name}/config.json", "w"))
os.makedirs(f"{dst}-sharded")
shutil.copy(f"{src}/config.json", f"{dst}-sharded")
open(f"{dst}-sharded/model.safetensors.index.json", "w").write("{}")
PY
"$ckpt" logits "$work/hub" --tokens "$tokens" | cmp - "$work/hf.json"
"$ckpt" logits "$work/hub/bf16.safetensors" --tokens "$tokens" > /dev/null
expect_error() {  # expect_error MESSAGE COMMAND...: fails unless COMMAND fails saying MESSAGE
  local message="$1" out; shift
  if out="$("$@" 2>&1)"; then echo "expected an error: $*"; exit 1; fi
  grep -qF -- "$message" <<< "$out" || { echo "expected '$message' from $*, got: $out"; exit 1; }
}
expect_error '"activation_function" is "relu"' "$ckpt" logits "$work/hub-relu" --tokens 1
expect_error '"layer_norm_epsilon" is 1e-06' "$ckpt" logits "$work/hub-eps" --tokens 1
expect_error '"tie_word_embeddings" is false' "$ckpt" logits "$work/hub-untied" --tokens 1
expect_error 'is a sharded Hugging Face checkpoint' "$ckpt" logits "$work/hub-sharded" --tokens 1
train=("$build/fsdp-run" -n 1 -- "$build/fsdp-train" --steps 1)
expect_error "is a GPT-2 model: pass --model gpt" "${train[@]}" --model llama --init-from "$work/hub"
expect_error "--width 128 contradicts --init-from" "${train[@]}" --init-from "$work/hub" --width 128
echo "ok: $kind in and out"
