#!/usr/bin/env bash
# Shared by the end-to-end cases in this folder: each case is one file,
#   tests/trainer/CASE.sh BUILD_DIR
# sourcing this library. Assert on figures (the trainer's --summary JSON and
# --log JSON lines, fsdp-plan --json) with jq, not on printed wording.
set -uo pipefail
build="$(cd "$1" && pwd)"
case_name="$(basename "$0" .sh)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$(mktemp -d "/tmp/fsdp_${case_name}.XXXXXX")
trap 'rm -rf "$work"' EXIT
run="$build/fsdp-run"
train="$build/fsdp-train"

fail() { echo "FAIL: $case_name: $*" >&2; exit 1; }
pass() { echo "PASS: $case_name"; exit 0; }

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
  "$run" -n "$ranks" "${launcher[@]}" -- "$train" --log "$work/$name.jsonl" --summary "$work/$name.json" "$@" \
    > "$work/$name.out" 2>&1 || { cat "$work/$name.out" >&2; fail "run '$name' ($ranks ranks: $*) failed"; }
}

# Random lower-case text (30,000 bytes) as a data file: $work/data.txt.
make_text_data() { head -c 60000 /dev/urandom | tr -dc 'a-z .\n' | head -c 30000 > "$work/data.txt"; }

# Overwrites one byte in the data section of a file (100 bytes from its end).
corrupt_byte() { printf 'X' | dd of="$1" bs=1 seek=$(( $(stat -c %s "$1") - 100 )) conv=notrunc 2>/dev/null; }

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
