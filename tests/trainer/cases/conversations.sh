# Conversations end to end: fsdp-data encode-chat with a ChatML template and
# a tokenizer trained here, then fsdp-train on them. The answers' loss is
# the mean over the global batch's answer tokens, so W = 1, 2, 4 and
# accumulation train the same model although each rank's rows hold different
# answer lengths; recompute of packed units changes nothing; packing fills
# the rows; bad lines are refused naming the line.

model_dir="$work/chat-model"
mkdir -p "$model_dir"
"$build/fsdp-data" train-tokenizer --vocab-size 512 --special "<|endoftext|>" --special "<|im_start|>" \
  --special "<|im_end|>" -o "$model_dir/tokenizer.json" "$here/../../data/default_corpus.txt" > /dev/null ||
  fail "train-tokenizer failed"
cat > "$model_dir/chat_template.jinja" <<'JINJA'
{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
JINJA
# 300 conversations from the corpus's lines: a question line, an answer of
# one to three lines, a system message in every third.
jq -Rnc '[inputs | gsub("^ +"; "") | select(length > 0)] | . as $l | range(0; 300) |
  {messages: ([if . % 3 == 0 then {role: "system", content: "You continue licenses."} else empty end] +
              [{role: "user", content: $l[.]}, {role: "assistant", content: ($l[. + 1:. + 2 + (. % 3)] | join(" "))}])}' \
  "$here/../../data/default_corpus.txt" > "$work/chats.jsonl"
[ "$(wc -l < "$work/chats.jsonl")" -eq 300 ] || fail "expected 300 conversations"

"$build/fsdp-data" encode-chat --model "$model_dir" -o "$work/chats.bin" --context 128 "$work/chats.jsonl" ||
  fail "encode-chat failed"
json_is "$work/chats.bin.chat.json" .conversations 300
json_ok "$work/chats.bin.chat.json" '.answer_tokens > 0 and .answer_tokens < .tokens and .truncated > 0'
# --too-long drop leaves out the ones truncate cut.
"$build/fsdp-data" encode-chat --model "$model_dir" -o "$work/dropped.bin" --context 128 --too-long drop -q \
  "$work/chats.jsonl" || fail "encode-chat --too-long drop failed"
json_is "$work/dropped.bin.chat.json" '.conversations + .dropped_too_long' 300
json_is "$work/dropped.bin.chat.json" .dropped_too_long "$(jq .truncated "$work/chats.bin.chat.json")"
# render-chat --ids gives the first conversation's ids and mask as written.
head -1 "$work/chats.jsonl" > "$work/first.jsonl"
"$build/fsdp-data" render-chat --model "$model_dir" --ids "$work/first.jsonl" > "$work/first.json"
first_length=$(jq '.ids | length' "$work/first.json")
[ "$(head -c $((2 * first_length)) "$work/chats.bin" | od -An -tu2 -v | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')" = \
  "$(jq -r '.ids | map(tostring) | join(" ")' "$work/first.json")" ] || fail "render-chat --ids differs from the file"
jq -e '.loss_mask | (.[0] == 0) and (add > 0)' "$work/first.json" > /dev/null || fail "the first mask: $(cat "$work/first.json")"

# W = 1, 2, 4 and accumulation: the same losses; recompute of sublayer units too.
common=(--model llama --preset tiny --context 256 --tokenizer "$model_dir/tokenizer.json" --data "$work/chats.bin")
steps=(--steps 4 --eval-every 4 --eval-sequences 8)
train_run w1 1 "${common[@]}" "${steps[@]}" --batch 8 --sample 24 --chat-template "$model_dir" \
  --prompt "What is free software?"
train_run w2 2 "${common[@]}" "${steps[@]}" --batch 4
train_run w4 4 "${common[@]}" "${steps[@]}" --batch 2
train_run accum 2 "${common[@]}" "${steps[@]}" --batch 2 --grad-accum 2
train_run recompute 2 "${common[@]}" "${steps[@]}" --batch 4 --wrap sublayer --activation-checkpointing
train_run zero2 2 "${common[@]}" "${steps[@]}" --batch 4 --strategy shard_grad_op
train_run ddp 2 "${common[@]}" "${steps[@]}" --batch 4 --strategy no_shard
train_run hybrid 4 --ranks-per-node 2 -- "${common[@]}" "${steps[@]}" --batch 2 --strategy hybrid_shard
for run_name in w2 w4 accum recompute zero2 ddp hybrid; do
  compare_losses "$work/$run_name.jsonl" "$work/w1.jsonl" 1e-5 4
done
json_ok "$work/w2.json" '(.final_val_loss | type == "number") and .conversations.answer_tokens_trained > 0'
json_ok "$work/w2.json" '.conversations.packing_efficiency > 0.9 and .conversations.train_conversations == 270'
grep -q "block-diagonal causal mask" "$work/w2.out" || fail "the banner does not say how conversations attend"
# --chat-template: the answer to --prompt alone, after the template's generation prompt.
grep -q "== answer to --prompt ([0-9]* tokens, at most 24, .*, the template's generation prompt before it) ==" \
  "$work/w1.out" || fail "no answer printed: $(tail -3 "$work/w1.out")"
expect_error "--no-pack is for conversations" "$run" -n 1 -- "$train" --preset tiny --steps 1 --no-pack
expect_error "--chat-template is for --sample N" "$run" -n 1 -- "$train" "${common[@]}" --steps 1 \
  --chat-template "$model_dir"
expect_error "--chat-template needs --tokenizer" "$run" -n 1 -- "$train" --model llama --preset tiny \
  --data "$work/chats.bin" --chat-template "$model_dir" --steps 1

# Resume: 2 steps, then resumed to 4, gives the straight run's losses bit for bit.
train_run first 2 "${common[@]}" --steps 2 --eval-every 4 --eval-sequences 8 --batch 4 --ckpt-dir "$work/ck"
train_run rest 2 "${common[@]}" "${steps[@]}" --batch 4 --ckpt-dir "$work/ck" --resume
cat "$work/first.jsonl" "$work/rest.jsonl" | jq -c 'select(.loss != null) | {loss}' > "$work/resumed.jsonl"
jq -c 'select(.loss != null) | {loss}' "$work/w2.jsonl" > "$work/straight.jsonl"
same_losses "$work/resumed.jsonl" "$work/straight.jsonl" 4
expect_error "was trained on conversations, packed, but this run reads conversations, one a row" \
  "$run" -n 2 -- "$train" "${common[@]}" --steps 6 --batch 4 --ckpt-dir "$work/ck" --resume --no-pack

# One conversation a row: the same answers, a lower efficiency.
train_run unpacked 2 "${common[@]}" --batch 4 --no-pack --steps 1
json_ok "$work/unpacked.json" '.conversations.packing_efficiency < 0.5 and .conversations.packed == false'

# A bad line is refused naming the file and the line; nothing is written.
{ head -2 "$work/chats.jsonl"; echo '{"messages": [{"content": "no role"}]}'; } > "$work/bad.jsonl"
expect_error "bad.jsonl:3: message 0 has no \"role\"" \
  "$build/fsdp-data" encode-chat --model "$model_dir" -o "$work/bad.bin" "$work/bad.jsonl"
[ ! -e "$work/bad.bin" ] || fail "a refused encode-chat left bad.bin"
echo 'not json' > "$work/bad2.jsonl"
expect_error "bad2.jsonl:1: not JSON" "$build/fsdp-data" encode-chat --model "$model_dir" -o "$work/bad2.bin" "$work/bad2.jsonl"
