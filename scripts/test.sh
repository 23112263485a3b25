#!/usr/bin/env bash
# The test suite: sets up and builds fsdp-cpp against both LibTorches
# (scripts/libtorch_kinds.sh: Debian's 1.13 in build/, PyPI's wheel in
# build-wheel/) and runs every test
# against each (multi-rank ones under fsdp-run). Ends with ctest's summary per
# LibTorch and one line over both. Extra arguments go to ctest (e.g. -R trainer_).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh
passed=0; failed=0; status=0
for kind in "${libtorch_kinds[@]}"; do
  bash scripts/setup.sh "$kind" || exit 1
  build="$(build_dir "$kind")"
  echo "== the suite against the $kind LibTorch ($build/)"
  (cd "$build" && ctest --output-on-failure --timeout 900 "$@") 2>&1 | tee "$build/ctest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  read -r p f <<<"$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 \1/p' "$build/ctest.log" | tail -1)"
  [ -n "${p:-}" ] || { status=1; continue; }
  passed=$(( passed + p - f )); failed=$(( failed + f ))
done
echo "both LibTorches (the line below counts tests of both runs):"
echo "total: $passed passed, $failed failed"
exit "$status"
