#!/usr/bin/env bash
# Runs the trainer cases of the table in cases.sh.
#   bash tests/trainer/run.sh BUILD_DIR CASE   one case: exit 0 passed, 77 skipped, else failed
#   bash tests/trainer/run.sh --list           the table: a case and what it asserts per line
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
case_names=() case_claims=()
row() { case_names+=("$1"); case_claims+=("$2"); }
source "$here/cases.sh"

if [ "${1:-}" = --list ]; then
  for i in "${!case_names[@]}"; do printf '%s\t%s\n' "${case_names[$i]}" "${case_claims[$i]}"; done
  exit 0
fi
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR CASE, or $0 --list" >&2; exit 2; }
known=0
for name in "${case_names[@]}"; do [ "$name" != "$2" ] || known=1; done
[ $known = 1 ] || { echo "run.sh: no case '$2' in the table (run.sh --list names them)" >&2; exit 2; }

start_case "$1" "$2"
function_name="case_${case_name//-/_}"
if declare -F "$function_name" > /dev/null; then
  "$function_name"
elif [ -f "$here/cases/$case_name.sh" ]; then
  # A file that does not parse would stop sourcing at once and still pass.
  bash -n "$here/cases/$case_name.sh" || fail "cases/$case_name.sh does not parse"
  source "$here/cases/$case_name.sh"
else
  fail "the table names this case, but there is neither a function $function_name nor cases/$case_name.sh"
fi
pass
