#!/usr/bin/env bash
# The test suite: sets up and builds fsdp-cpp against both LibTorches
# (scripts/libtorch_kinds.sh: Debian's 1.13 in build/, PyPI's wheel in
# build-wheel/) and runs every test against each (multi-rank ones under
# fsdp-run). Ends with ctest's summary per LibTorch, the tests that skipped
# and why, and one line over both:
#   total: N passed, N failed, N skipped
# Extra arguments go to ctest (e.g. -R trainer_).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh

# skip_reasons BUILD NAME...: for each skipped test, its name and the first
# line of its output that says why (ctest keeps every test's output in
# Testing/Temporary/LastTest.log, between "Output:" and "<end of output>").
skip_reasons() {
  local build="$1"; shift
  local name
  for name in "$@"; do
    awk -v name="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Test: " name "$" { inside = 1; next }
      inside && /<end of output>/ { exit }
      inside && tolower($0) ~ /skip/ && !/^Command:/ { print; exit }' \
      "$build/Testing/Temporary/LastTest.log" | sed "s|^|  $name: |;s|^\(  $name: \)\s*|\1|" |
      grep . || echo "  $name: (the test gave no reason)"
  done
}

passed=0; failed=0; skipped=0; status=0
for kind in "${libtorch_kinds[@]}"; do
  bash scripts/setup.sh "$kind" || exit 1
  build="$(build_dir "$kind")"
  echo "== the suite against the $kind LibTorch ($build/)"
  (cd "$build" && ctest --output-on-failure --timeout 900 "$@") 2>&1 | tee "$build/ctest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  read -r total f <<<"$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 \1/p' "$build/ctest.log" | tail -1)"
  [ -n "${total:-}" ] || { status=1; continue; }
  # ctest counts a skipped test (SKIP_RETURN_CODE) among the passed ones and
  # lists it under "The following tests did not run", marked (Skipped).
  mapfile -t skips < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$build/ctest.log")
  if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped against the $kind LibTorch, and why:"
    skip_reasons "$build" "${skips[@]}"
  fi
  passed=$(( passed + total - f - ${#skips[@]} )); failed=$(( failed + f )); skipped=$(( skipped + ${#skips[@]} ))
done
echo "both LibTorches (the line below counts tests of both runs):"
echo "total: $passed passed, $failed failed, $skipped skipped"
exit "$status"
