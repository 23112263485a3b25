#!/usr/bin/env bash
# ctest hugging_face_chat: conversations against `transformers` (PyPI), with
# the hub's real chat templates (llama-cpp-python's sdist, python_refs.sh):
#   1. for a tokenizer of each family's shape (Llama 3.1, Qwen2.5, Qwen3,
#      SmolLM3) with its real template, fsdp-data render-chat --ids gives
#      apply_chat_template(tokenize=True)'s ids, and the masks of rendering
#      the prefixes (fsdp/chat_encoding.h's definition), on the conversation
#      set of chat_reference.py: system or none, multi-turn, unicode, empty;
#      and with a template whose answers are {% generation %} blocks,
#      transformers' own return_assistant_tokens_mask;
#   2. a random Llama with the Qwen2.5 folder: fsdp-train's first loss on
#      encode-chat's files, packed into one row and one conversation a row,
#      equals transformers' loss over the same answer tokens (labels -100
#      elsewhere), each conversation run alone, within 1e-5.
#   chat.sh BUILD_DIR SOURCE_DIR ids|loss   (the first is the same on every
#   LibTorch; the second trains, with 2.x's fused attention under the mask)
set -euo pipefail
build="$1" source="$2" part="$3"
source "$source/tests/python_refs_lib.sh"
require_python torch transformers
templates="${FSDP_TEST_ASSETS:-$source/.venv/assets}/chat_templates"
[ -d "$templates" ] || skip "no hub chat templates in $templates (scripts/python_refs.sh fetches them)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
ref=("$python" "$source/tests/hugging_face/chat_reference.py")
"${ref[@]}" conversations "$work/chats.jsonl"

ids_part() {
  echo "== 1. ids and masks against apply_chat_template"
  # ChatML whose answers are {% generation %} blocks (as TRL's training templates mark them).
  cat > "$work/generation.jinja" <<'JINJA'
{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
JINJA
  local made=() checked=() family name file
  for family in llama3:meta-llama-Llama-3.1-8B-Instruct qwen2.5:Qwen-Qwen2.5-7B-Instruct qwen3:Qwen-Qwen3-0.6B \
                smollm3:HuggingFaceTB-SmolLM3-3B qwen2.5:generation; do
    name="${family%%:*}" file="$templates/${family#*:}.jinja"
    [ "${family#*:}" != generation ] || { name=generation file="$work/generation.jinja"; }
    mkdir -p "$work/$name"
    made+=("${family%%:*}" "$file" "$work/$name")
    checked+=("$work/$name" "$work/$name.ids.jsonl")
  done
  "${ref[@]}" make "${made[@]}"
  for ((i = 0; i < ${#checked[@]}; i += 2)); do
    "$build/fsdp-data" render-chat --model "${checked[i]}" --ids "$work/chats.jsonl" > "${checked[i + 1]}"
  done
  "${ref[@]}" ids "$work/chats.jsonl" "${checked[@]}"
}

loss_part() {
  echo "== 2. the loss of a random Llama against transformers'"
  folder="$work/qwen2.5"
  mkdir -p "$folder"
  "${ref[@]}" make qwen2.5 "$templates/Qwen-Qwen2.5-7B-Instruct.jinja" "$folder"
  "$build/fsdp-data" render-chat --model "$folder" --ids "$work/chats.jsonl" > "$work/qwen2.5.ids.jsonl"
  "${ref[@]}" model "$folder"
  "$build/fsdp-data" encode-chat --model "$folder" -o "$work/chats.bin" "$work/chats.jsonl"
  common=(--model llama --init-from "$folder" --data "$work/chats.bin" --steps 1 --val-fraction 0 --data-order sequential)
  "$build/fsdp-run" -n 1 -- "$build/fsdp-train" "${common[@]}" --batch 1 --summary "$work/packed.json" > "$work/packed.out"
  "$build/fsdp-run" -n 1 -- "$build/fsdp-train" "${common[@]}" --batch 5 --no-pack --summary "$work/unpacked.json" \
    > "$work/unpacked.out"
  jq -e '.conversations.rows == 1' "$work/packed.json" > /dev/null || { echo "expected one packed row"; exit 1; }
  "${ref[@]}" loss "$folder" "$work/chats.jsonl" "$work/qwen2.5.ids.jsonl" "$work/packed.json" "$work/unpacked.json"
}

case "$part" in
  ids) ids_part ;;
  loss) loss_part ;;
  *) echo "chat.sh: expected ids or loss, got '$part'" >&2; exit 2 ;;
esac
