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

# skip_reasons JUNIT: each skipped test of ctest's JUnit report, with the
# first line of its output that says why. (The JUnit file, not
# Testing/Temporary/LastTest.log: a case that runs ctest itself in the build
# folder, as the GPU check's dry run does, overwrites that one.)
skip_reasons() {
  awk '
    /<testcase / { match($0, /name="[^"]*"/); name = substr($0, RSTART + 6, RLENGTH - 7)
                   skipped = ($0 ~ /status="notrun"/); reason = ""; inside = 0 }
    skipped && /<system-out>/ { inside = 1; sub(/.*<system-out>/, "") }
    skipped && inside && reason == "" && tolower($0) ~ /skip/ { reason = $0 }
    /<\/system-out>/ { inside = 0 }
    skipped && /<\/testcase>/ {
      sub(/<\/system-out>.*/, "", reason); sub(/^[ \t]+/, "", reason)
      gsub(/&apos;/, "\047", reason); gsub(/&quot;/, "\"", reason); gsub(/&lt;/, "<", reason)
      gsub(/&gt;/, ">", reason); gsub(/&amp;/, "\\&", reason)
      printf "  %s: %s\n", name, (reason == "" ? "(the test gave no reason)" : reason); skipped = 0 }' "$1"
}

# The Python references (tokenizers, transformers, torch) the interop tests
# compare against, for both LibTorches' runs.
bash scripts/python_refs.sh || exit 1
export FSDP_TEST_PYTHON="$PWD/.venv/bin/python"
passed=0; failed=0; skipped=0; status=0
for kind in "${libtorch_kinds[@]}"; do
  bash scripts/setup.sh "$kind" || exit 1
  build="$(build_dir "$kind")"
  echo "== the suite against the $kind LibTorch ($build/)"
  junit="$(cd "$build" && pwd)/ctest-junit.xml"; rm -f "$junit"
  (cd "$build" && ctest --output-on-failure --timeout 900 --output-junit "$junit" "$@") 2>&1 | tee "$build/ctest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  read -r total f <<<"$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 \1/p' "$build/ctest.log" | tail -1)"
  [ -n "${total:-}" ] || { status=1; continue; }
  # ctest counts a skipped test (SKIP_RETURN_CODE) among the passed ones and
  # lists it under "The following tests did not run", marked (Skipped).
  mapfile -t skips < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$build/ctest.log")
  if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped against the $kind LibTorch, and why:"
    skip_reasons "$junit"
  fi
  passed=$(( passed + total - f - ${#skips[@]} )); failed=$(( failed + f )); skipped=$(( skipped + ${#skips[@]} ))
done
echo "both LibTorches (the line below counts tests of both runs):"
echo "total: $passed passed, $failed failed, $skipped skipped"
exit "$status"
