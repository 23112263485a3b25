#!/usr/bin/env bash
# The bad-input table (table.sh): each tool given the hostile variants of its
# inputs. A row is
#   row TOOL STATUS TEXT COMMAND...
# and asserts that COMMAND, run in the fixtures' folder,
#   - ends within $limit seconds (a hang fails the row, not the suite),
#   - exits STATUS (docs/debugging.md, "Errors and exit statuses"),
#   - prints TEXT, which names the input it refuses,
#   - leaves out/ empty: the rows write their outputs there, so a file left
#     behind, whole, part-written or temporary, fails the row.
#   bash tests/bad_input/run.sh BUILD_DIR TOOL   the rows of one tool (fsdp-data, fsdp-plan, ...)
#   bash tests/bad_input/run.sh --list           the tools and their rows' counts
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

rows_of=()
row() { rows_of+=("$1"); }
if [ "${1:-}" = --list ]; then
  data="" plan="" ckpt="" train="" run=""
  source "$here/table.sh"
  printf '%s\n' "${rows_of[@]}" | sort | uniq -c
  exit 0
fi
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR TOOL, or $0 --list" >&2; exit 1; }
build="$(cd "$1" && pwd)" || exit 1
tool="$2"
data="$build/fsdp-data" plan="$build/fsdp-plan" ckpt="$build/fsdp-ckpt" train="$build/fsdp-train" run="$build/fsdp-run"
export data plan ckpt train run
work=$(mktemp -d "/tmp/fsdp_bad_input_$tool.XXXXXX")
trap 'rm -rf "$work"' EXIT
out="$work/out"
limit=60

# ---- the fixtures: one of each hostile kind, beside good ones ----
cd "$work" || exit 1
for i in $(seq 200); do echo "the quick brown fox jumps over the lazy dog, line $i of a small corpus"; done > text.txt
mkdir dir dir.bin dir.json dir.safetensors
mkfifo fifo fifo.bin fifo.json fifo.safetensors
: > empty.txt
printf 'abc' > odd.bin
printf 'not json at all' > not-json.json
printf 'not a safetensors file at all' > garbage.safetensors
# A whole safetensors file (one F32 tensor of 2), then the same less its last 4 bytes.
header='{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
{ printf "\\x$(printf %02x ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$header"; printf '\0\0\x80\x3f\0\0\0\x40'; } > whole.safetensors
head -c -4 whole.safetensors > truncated.safetensors
cp "$here/../fixtures/hub_configs/llama-3.2-1b.json" .  # a real config.json, for the rows that change it
"$data" train-tokenizer --vocab-size 300 -o tok.json text.txt 2> /dev/null || { echo "FAIL: the fixture tokenizer"; exit 1; }
"$data" encode -q --tokenizer tok.json -o tokens.bin text.txt || { echo "FAIL: the fixture tokens"; exit 1; }
# Tokenizers that lie about their ids: an id of 2^31 - 1, of 4e9, not a
# whole number, one id given to two tokens, and an added token under an id
# the vocab gives another token (`tokenizers` gives it the next id).
first_token() { jq -r '.model.vocab | to_entries | .[0].key' tok.json; }
jq --arg t "$(first_token)" '.model.vocab[$t] = 2147483647' tok.json > tok-id-2e31.json
jq --arg t "$(first_token)" '.model.vocab[$t] = 4000000000' tok.json > tok-id-4e9.json
jq --arg t "$(first_token)" '.model.vocab[$t] = 1.5' tok.json > tok-id-float.json
jq '.model.vocab as $v | ($v | to_entries) as $e | .model.vocab[$e[1].key] = $e[0].value' tok.json > tok-dup.json
jq '.added_tokens += [{"id": 5, "content": "<x>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]' tok.json > tok-added-id.json
# A rank program for fsdp-run: ready once started, 75 on SIGUSR1 or SIGTERM
# (as fsdp-train's preemption), else waits.
cat > rank75.sh <<'EOF'
trap 'echo "rank $OMPI_COMM_WORLD_RANK stopping: preempted"; exit 75' USR1 TERM
touch "ready.$OMPI_COMM_WORLD_RANK"
sleep 60 & wait
EOF

# Models the fsdp-train rows start from, made on first use (the other
# tools' rows need none): a Llama of the tiny preset saved as a Hugging Face
# folder (llama-hf/) and a PEFT adapter of the tiny GPT (adapter/).
made_models() {
  [ -d llama-hf ] && return 0
  "$run" -n 1 -- "$train" --model llama --preset tiny --steps 1 --save-final llama-hf --save-format hf > /dev/null &&
    "$run" -n 1 -- "$train" --preset tiny --steps 1 --lora-rank 4 --lora-targets c_attn --save-final adapter \
      --save-format peft > /dev/null || { echo "FAIL: the fixture models"; return 1; }
}
# set_first_float FILE VALUE_HEX: the first float32 of a safetensors file's
# data (little-endian bytes of VALUE_HEX, e.g. 47c35000 = 1e5) set in place.
set_first_float() {
  local header_length offset
  header_length=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
  offset=$((8 + header_length))
  printf "\\x${2:6:2}\\x${2:4:2}\\x${2:2:2}\\x${2:0:2}" | dd of="$1" bs=1 seek="$offset" conv=notrunc status=none
}
export -f made_models set_first_float

# signal_group SIGNAL RANKS COMMAND...: COMMAND in a process group of its
# own, as a scheduler starts a job; once its RANKS ranks are ready, SIGNAL
# to the whole group (what Slurm and a shell's kill -- -PGID do); its status.
signal_group() {
  local signal="$1" ranks="$2" i; shift 2
  rm -f ready.*
  setsid "$@" &
  local leader=$!
  for i in $(seq 200); do [ "$(ls ready.* 2>/dev/null | wc -l)" -ge "$ranks" ] && break; sleep 0.1; done
  kill -"$signal" -- -"$leader"
  wait "$leader"
}

# ---- the rows ----
rows=0 failures=0
row() {
  local row_tool="$1" want="$2" text="$3"; shift 3
  [ "$row_tool" = "$tool" ] || return 0
  rows=$((rows + 1))
  rm -rf "$out" && mkdir "$out"
  local start=$SECONDS output status problem=""
  # Through bash, so that a row's command may be a function of the table's
  # (exported, with the fixtures' names).
  ! declare -F "$1" > /dev/null || export -f "$1"
  output=$(timeout -k 5 "$limit" bash -c '"$@"' row "$@" 2>&1 < /dev/null); status=$?
  if [ $status -eq 124 ] || [ $status -eq 137 ]; then
    problem="did not end within $limit s"
  elif [ $status -ne "$want" ]; then
    problem="exit status $status, expected $want"
  elif ! grep -qF -- "$text" <<< "$output"; then
    problem="its output lacks '$text'"
  elif [ -n "$(ls -A "$out")" ]; then
    problem="it left $(ls -A "$out" | tr '\n' ' ')in out/"
  fi
  local shown="${*//$build\//}"
  if [ -n "$problem" ]; then
    failures=$((failures + 1))
    echo "FAIL: $shown: $problem ($((SECONDS - start)) s)"
    sed 's/^/    | /' <<< "$output" | tail -8
  else
    echo "ok: $shown (exit $status, $((SECONDS - start)) s): ${text:-(no text)}"
  fi
}
source "$here/table.sh"
[ $rows -gt 0 ] || { echo "FAIL: the table has no rows for '$tool'"; exit 1; }
echo "$tool: $((rows - failures)) of $rows rows passed"
[ $failures -eq 0 ]
