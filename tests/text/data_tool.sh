#!/usr/bin/env bash
# ctest text_data_tool: fsdp-data end to end: train, encode to .bin and .u32
# (the same ids), --append-eot, inspect, decode, and its refusals (a
# vocabulary too large for .bin, an unknown token file name, a missing file).
#   data_tool.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" source="$2"
data="$build/fsdp-data"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error MESSAGE COMMAND...: the command fails, printing MESSAGE.
expect_error() {
  local message="$1"; shift
  if "$@" > "$work/out" 2>&1; then fail "'$*' succeeded, expected: $message"; fi
  grep -qF -- "$message" "$work/out" || fail "'$*' did not say '$message': $(cat "$work/out")"
}
corpus="$source/data/default_corpus.txt"
"$data" train-tokenizer --vocab-size 1024 -o "$work/tok.json" "$corpus"
"$data" encode --tokenizer "$work/tok.json" -o "$work/corpus.bin" --threads 2 --chunk-bytes 8192 --append-eot "$corpus" 2> "$work/progress"
grep -q "tokens" "$work/progress" || fail "no progress line on stderr: $(cat "$work/progress")"
"$data" encode --tokenizer "$work/tok.json" -o "$work/corpus.u32" -q --append-eot "$corpus"
bin_tokens=$(( $(stat -c %s "$work/corpus.bin") / 2 ))
u32_tokens=$(( $(stat -c %s "$work/corpus.u32") / 4 ))
[ "$bin_tokens" -eq "$u32_tokens" ] || fail ".bin holds $bin_tokens tokens, .u32 $u32_tokens"
cmp <(od -An -v -tu2 -w2 "$work/corpus.bin" | tr -d ' ') <(od -An -v -tu4 -w4 "$work/corpus.u32" | tr -d ' ') \
  || fail ".bin and .u32 hold different ids"
[ "$(od -An -tu2 -j $(( (bin_tokens - 1) * 2 )) "$work/corpus.bin" | tr -d ' ')" = 0 ] || fail "--append-eot: no <|endoftext|> (id 0) at the end"
"$data" inspect "$work/corpus.bin" --tokenizer "$work/tok.json" > "$work/inspect"
grep -q "^tokens: $bin_tokens$" "$work/inspect" || fail "inspect: $(cat "$work/inspect")"
grep -q "^width: 16-bit" "$work/inspect" || fail "inspect width: $(cat "$work/inspect")"
grep -q "^first tokens decoded: " "$work/inspect" || fail "inspect decode: $(cat "$work/inspect")"
"$data" decode --tokenizer "$work/tok.json" "$work/corpus.u32" > "$work/decoded"
cmp <(cat "$corpus"; printf '<|endoftext|>') "$work/decoded" || fail "decode(encode(corpus)) differs from the corpus"
# A vocabulary of 70,001 ids (a token at 70000, in the vocab: an added
# token takes its vocab id, else the next after the vocab) does not fit .bin's uint16.
python3 - "$work/tok.json" "$work/big.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["vocab"]["<|big|>"] = 70000
t["added_tokens"].append({"id": 70000, "content": "<|big|>", "special": True, "normalized": False})
json.dump(t, open(sys.argv[2], "w"))
PY
expect_error "the vocabulary of 70001 tokens does not fit" "$data" encode --tokenizer "$work/big.json" -o "$work/big.bin" "$corpus"
[ ! -e "$work/big.bin" ] || fail "a refused encode left $work/big.bin"
printf 'x <|big|>' > "$work/big.txt"
"$data" encode --tokenizer "$work/big.json" -o "$work/big.u32" -q "$work/big.txt"
"$data" inspect "$work/big.u32" | grep -q "^max id: 70000$" || fail ".u32 does not hold id 70000"
expect_error "expected a name ending in .bin (uint16 ids) or .u32" "$data" encode --tokenizer "$work/tok.json" -o "$work/x.tokens" "$corpus"
expect_error "cannot open the file" "$data" encode --tokenizer "$work/missing.json" -o "$work/x.bin" "$corpus"
expect_error "the text file '$work/missing.txt' does not exist" "$data" encode --tokenizer "$work/tok.json" -o "$work/x.bin" "$work/missing.txt"
echo "fsdp-data: all checks passed"
