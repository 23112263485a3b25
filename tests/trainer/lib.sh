#!/usr/bin/env bash
# What the trainer cases share (run.sh sources it, then the table,
# cases.sh). Assert on figures (the trainer's --summary JSON and --log JSON
# lines, fsdp-plan --json) with jq, not on printed wording.
set -uo pipefail

# start_case BUILD_DIR CASE: the globals every case uses: $build, $case_name,
# $work (a fresh folder, removed on exit), $run (fsdp-run), $train
# (fsdp-train); $here is this folder.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start_case() {
  build="$(cd "$1" && pwd)" || { echo "FAIL: $2: no build folder '$1'" >&2; exit 1; }
  case_name="$2"
  work=$(mktemp -d "/tmp/fsdp_${case_name}.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  run="$build/fsdp-run"
  train="$build/fsdp-train"
}

fail() { echo "FAIL: $case_name: $*" >&2; exit 1; }
pass() { echo "PASS: $case_name"; exit 0; }
# skip "reason": the case cannot run here. Exit 77, which every case is
# registered to report as skipped (SKIP_RETURN_CODE), never as passed.
skip() { echo "SKIPPED: $case_name: $*"; exit 77; }

# expect_error "text the message must contain" COMMAND...: the command must
# exit non-zero and print the text.
expect_error() {
  local want="$1"; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || { echo "$out" >&2; fail "expected a non-zero exit from: $*"; }
  grep -qF -- "$want" <<<"$out" || { echo "$out" >&2; fail "message lacks '$want'"; }
  echo "ok: '$want' (exit $rc)"
}

# train_run NAME RANKS [LAUNCHER FLAGS... --] TRAINER ARGS...: runs the
# trainer, writing $work/NAME.out, $work/NAME.jsonl (log) and $work/NAME.json
# (summary); fails the case, showing the output, if the run fails.
#   train_run w2 2 --preset tiny --steps 4
#   train_run hybrid 4 --ranks-per-node 2 -- --preset tiny --strategy hybrid_shard
train_run() {
  local name="$1" ranks="$2"; shift 2
  local launcher=() arg
  for arg in "$@"; do
    if [ "$arg" = "--" ]; then
      while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
      shift
      break
    fi
  done
  # FSDP_TRAINER_RUN_COUNT=FILE: one line per training run, for counting them.
  [ -z "${FSDP_TRAINER_RUN_COUNT:-}" ] || echo "$case_name $name" >> "$FSDP_TRAINER_RUN_COUNT"
  "$run" -n "$ranks" "${launcher[@]}" -- "$train" --log "$work/$name.jsonl" --summary "$work/$name.json" "$@" \
    > "$work/$name.out" 2>&1 || { cat "$work/$name.out" >&2; fail "run '$name' ($ranks ranks: $*) failed"; }
}

# Random lower-case text (30,000 bytes) as a data file: $work/data.txt.
make_text_data() { head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"; }

# Changes one byte in the data section of a file (100 bytes from its end):
# its bits inverted (writing a fixed byte left the file intact whenever that
# byte was already there: 1 run in 256 of a random model).
corrupt_byte() {
  local at=$(( $(stat -c %s "$1") - 100 )) old
  old=$(dd if="$1" bs=1 skip="$at" count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
  printf "\\$(printf %03o $(( old ^ 255 )))" | dd of="$1" bs=1 seek="$at" conv=notrunc 2>/dev/null
}

# The "loss" values of a JSON-lines log, one per line.
losses() { jq -r '.loss' "$1"; }

# summary FILE FILTER: a field of a --summary JSON (jq filter).
summary() { jq -r "$2" "$1"; }

# require_steps LOG N: the log has exactly N step records.
require_steps() {
  local n; n=$(jq -s 'length' "$1" 2>/dev/null || echo 0)
  [ "$n" -eq "$2" ] || fail "$1 has $n step records, expected $2"
}

# compare_losses A B TOL [STEPS]: the two logs' losses agree to a relative
# tolerance, and (when STEPS is given) both hold exactly STEPS records.
compare_losses() {
  local a="$1" b="$2" tol="$3"
  if [ $# -ge 4 ]; then require_steps "$a" "$4"; require_steps "$b" "$4"; fi
  local na nb; na=$(losses "$a" | wc -l); nb=$(losses "$b" | wc -l)
  [ "$na" -gt 0 ] || fail "$a holds no losses"
  [ "$na" -eq "$nb" ] || fail "logs differ in length ($na vs $nb)"
  paste <(losses "$a") <(losses "$b") | awk -v tol="$tol" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r;
      if (r > tol) { printf "step %d: %s vs %s (relative %.2e > %.0e)\n", NR, $1, $2, r, tol; bad = 1 } }
    END { printf "worst relative difference %.2e over %d steps\n", worst, NR; exit bad }' || fail "losses differ"
}

# same_losses A B [STEPS]: bit-for-bit equal losses (and, with STEPS, exactly
# that many records on both sides).
same_losses() {
  local a="$1" b="$2"
  if [ $# -ge 3 ]; then require_steps "$a" "$3"; require_steps "$b" "$3"; fi
  [ "$(losses "$a" | wc -l)" -gt 0 ] || fail "$a holds no losses"
  [ "$(losses "$a")" = "$(losses "$b")" ] || fail "losses of $a and $b differ"
}

# json_is FILE FILTER WANT: the jq filter's value in a JSON file (as jq -r
# prints it) is WANT.   json_is "$work/w2.json" .strategy full_shard
json_is() {
  local got; got=$(jq -r "$2" "$1" 2>&1) || fail "$1: jq '$2' failed: $got"
  [ "$got" = "$3" ] || fail "$(basename "$1"): $2 is '$got', expected '$3'"
  echo "ok: $(basename "$1"): $2 = $3"
}

# json_ok FILE FILTER [MESSAGE]: the jq filter is true of a JSON file.
json_ok() {
  jq -e "$2" "$1" >/dev/null 2>&1 || fail "${3:-$(basename "$1"): not $2}"
}

# log_is / log_ok LOG ...: the same, of a JSON-lines log read as one array
# of its records.   log_ok "$work/w2.jsonl" 'all(.grad_norm | type == "number")'
log_is() {
  local got; got=$(jq -rs "$2" "$1" 2>&1) || fail "$1: jq -s '$2' failed: $got"
  [ "$got" = "$3" ] || fail "$(basename "$1"): $2 is '$got', expected '$3'"
  echo "ok: $(basename "$1"): $2 = $3"
}
log_ok() {
  jq -se "$2" "$1" >/dev/null 2>&1 || fail "${3:-$(basename "$1"): not $2}"
}

# require_step_numbers LOG FIRST LAST: the log's records are steps FIRST,
# FIRST+1, ..., LAST, in order, each once (so LAST-FIRST+1 records).
require_step_numbers() {
  require_steps "$1" $(( $3 - $2 + 1 ))
  log_ok "$1" "[.[].step] == [range($2; $3 + 1)]" "$1 does not hold steps $2..$3 in order: $(jq -sc '[.[].step]' "$1")"
}

# log_steps LOG FIRST LAST: the records of steps FIRST..LAST (JSON lines).
log_steps() { jq -c "select(.step >= $2 and .step <= $3)" "$1"; }

# safetensors_header FILE: the JSON header of a safetensors file (its first
# 8 bytes are the header's length, little-endian).
safetensors_header() {
  local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$n" -lt "$(stat -c %s "$1")" ] || { echo "{}"; return 1; }
  head -c $(( n + 8 )) "$1" | tail -c "$n"
}

# zero_safetensors FILE SHAPES: a safetensors file of F32 zeros holding one
# tensor per entry of the JSON object SHAPES ({"name": [dims...], ...}), in
# its order: weights of a given layout, for runs that measure memory, not
# what a model learns.
zero_safetensors() {
  local header bytes length
  header=$(jq -c 'reduce to_entries[] as $t ({tensors: {}, end: 0};
      (reduce $t.value[] as $d (4; . * $d)) as $bytes
      | .tensors[$t.key] = {dtype: "F32", shape: $t.value, data_offsets: [.end, .end + $bytes]} | .end += $bytes)
    | .tensors' <<<"$2") || fail "zero_safetensors: SHAPES is not a JSON object of shapes"
  bytes=$(jq '[.[].data_offsets[1]] | max' <<<"$header")
  length=$(printf '%016x' "${#header}")  # the header's length as 8 little-endian bytes
  { printf "$(sed -E 's/(..)(..)(..)(..)(..)(..)(..)(..)/\\x\8\\x\7\\x\6\\x\5\\x\4\\x\3\\x\2\\x\1/' <<<"$length")"
    printf '%s' "$header"
    head -c "$bytes" /dev/zero; } > "$1"
}

# same_safetensors A B: the two files hold the same tensors (names, dtypes,
# shapes, offsets) with the same bytes; their __metadata__ may differ.
same_safetensors() {
  local ha hb
  ha=$(safetensors_header "$1") || fail "$1 has no safetensors header"
  hb=$(safetensors_header "$2") || fail "$2 has no safetensors header"
  [ "$(jq -S 'del(.__metadata__)' <<<"$ha")" = "$(jq -S 'del(.__metadata__)' <<<"$hb")" ] ||
    fail "$(basename "$1") and $(basename "$2") list different tensors"
  cmp -s <(tail -c +$(( $(od -An -tu8 -N8 "$1" | tr -d ' ') + 9 )) "$1") \
         <(tail -c +$(( $(od -An -tu8 -N8 "$2" | tr -d ' ') + 9 )) "$2") ||
    fail "the tensors of $(basename "$1") and $(basename "$2") differ: $(first_different_tensor "$1" "$2")"
  echo "ok: $(basename "$1") and $(basename "$2") hold the same $(jq 'del(.__metadata__) | length' <<<"$ha") tensors bit for bit"
}

# first_different_tensor A B: the name of the first tensor (in file order)
# whose bytes differ between two files of the same layout.
first_different_tensor() {
  local na nb name begin end
  na=$(od -An -tu8 -N8 "$1" | tr -d ' '); nb=$(od -An -tu8 -N8 "$2" | tr -d ' ')
  while read -r name begin end; do
    cmp -s <(tail -c +$(( na + 9 + begin )) "$1" | head -c $(( end - begin ))) \
           <(tail -c +$(( nb + 9 + begin )) "$2" | head -c $(( end - begin ))) || { echo "$name"; return; }
  done < <(safetensors_header "$1" | jq -r 'del(.__metadata__) | to_entries | sort_by(.value.data_offsets[0]) | .[] |
                                          "\(.key) \(.value.data_offsets[0]) \(.value.data_offsets[1])"')
  echo "(none: the files differ outside their tensors)"
}

# rank_pids PID PROGRAM: the processes started below PID (its children,
# theirs, ...) whose program, the base name of argv[0], is PROGRAM: under
# fsdp-run (mpirun), the ranks. One pid a line.
rank_pids() {
  local queue=("$1") pid child exe
  while [ ${#queue[@]} -gt 0 ]; do
    pid=${queue[0]}; queue=("${queue[@]:1}")
    for child in $(pgrep -P "$pid"); do
      exe=$(tr '\0' '\n' < "/proc/$child/cmdline" 2>/dev/null | head -1)
      if [ "$(basename -- "${exe:-none}")" = "$2" ]; then echo "$child"; else queue+=("$child"); fi
    done
  done
}
