#!/usr/bin/env bash
# The test suite: sets up and builds fsdp-cpp against both LibTorches
# (scripts/libtorch_kinds.sh: Debian's 1.13 in build/, PyPI's wheel in
# build-wheel/) and runs the tests against each (multi-rank ones under
# fsdp-run): the default LibTorch runs every test, the other the tests
# labelled `libtorch`, those whose outcome can differ between LibTorch
# versions (docs/how-it-works.md, "Which tests run against which
# LibTorch"). ctest runs two single-process tests at a time; a multi-rank
# test (PROCESSORS 2) holds both cores, so none overlaps another test.
# Ends with ctest's summary per LibTorch, the tests that skipped and why,
# the wall time of each phase, the 10 slowest tests, and one line over both:
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

# phase NAME COMMAND...: runs the command, noting its wall time (and when it
# started and ended, in seconds from the suite's start) for the table at the end.
suite_start=$SECONDS
phases=()
note_phase() { phases+=("$(printf '%-54s %5d s   (%4d s to %4d s)' "$1" $(( $3 - $2 )) $(( $2 - suite_start )) $(( $3 - suite_start )))"); }
phase() {
  local name="$1" start=$SECONDS rc; shift
  "$@"; rc=$?
  note_phase "$name" "$start" "$SECONDS"
  return $rc
}

# The order, so that the two cores are never idle while something is left
# to do:
#   1. Debian's packages for every LibTorch (apt-get, once, in front);
#   2. in the background: the Python references (torch, tokenizers,
#      transformers into .venv/), then the builds against the other
#      LibTorches at the lowest priority (nice 19), which take the cycles the
#      tests leave (a multi-rank case waiting on a collective, Python
#      starting, files written);
#   3. in front: the default LibTorch's build, then (once the Python
#      references are in) its tests;
#   4. each other LibTorch's tests, once its build is done.
for kind in "${libtorch_kinds[@]}"; do
  phase "Debian packages ($kind)" bash scripts/setup.sh "$kind" --packages || exit 1
done
background="$(mktemp -d /tmp/fsdp-test.XXXXXX)"
others=()
for kind in "${libtorch_kinds[@]}"; do [ "$kind" = "$default_libtorch_kind" ] || others+=("$kind"); done
set -m  # the background job in a process group of its own, so that an interrupted suite ends all of it
(
  step() {  # NAME COMMAND...: its output in NAME.log; NAME.done holds the status, start and end
    local name="$1" start=$SECONDS rc; shift
    "$@" > "$background/$name.log" 2>&1; rc=$?
    echo "$rc $start $SECONDS" > "$background/$name.done"
  }
  step refs bash scripts/python_refs.sh
  for kind in "${others[@]}"; do step "build-$kind" nice -n 19 bash scripts/setup.sh "$kind"; done
) &
background_job=$!
set +m
trap 'kill -- -$background_job 2>/dev/null; rm -rf "$background"' EXIT
# await NAME WHAT: waits for the background step, shows its output, notes its
# time; fails the suite if it failed.
await() {
  while [ ! -f "$background/$1.done" ] && kill -0 "$background_job" 2>/dev/null; do sleep 1; done
  [ -f "$background/$1.done" ] || { echo "test.sh: the background step '$1' ended without a status" >&2; exit 1; }
  local rc start end
  read -r rc start end < "$background/$1.done"
  cat "$background/$1.log"
  note_phase "$2 (in the background)" "$start" "$end"
  [ "$rc" -eq 0 ] || { echo "test.sh: $2 failed (exit $rc)" >&2; exit 1; }
}

export FSDP_TEST_PYTHON="$PWD/.venv/bin/python"
passed=0; failed=0; skipped=0; status=0
# run_ctest KIND CTEST-ARGS...: one ctest run in KIND's build folder, its
# summary and skips counted; its log appended to BUILD/ctest.log.
run_ctest() {
  local kind="$1" build; shift
  build="$(build_dir "$kind")"
  local junit; junit="$(cd "$build" && pwd)/ctest-junit.xml"; rm -f "$junit"
  (cd "$build" && ctest --output-on-failure --timeout 900 -j "$(nproc)" --output-junit "$junit" "$@") 2>&1 |
    tee "$build/ctest.part.log"
  local rc="${PIPESTATUS[0]}" total f
  cat "$build/ctest.part.log" >> "$build/ctest.log"
  grep -q '^No tests were found' "$build/ctest.part.log" && return  # a selection (with the caller's -R) that holds none
  [ "$rc" -eq 0 ] || status=1
  read -r total f <<<"$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 \1/p' "$build/ctest.part.log" | tail -1)"
  [ -n "${total:-}" ] || { status=1; return; }
  # ctest counts a skipped test (SKIP_RETURN_CODE) among the passed ones and
  # lists it under "The following tests did not run", marked (Skipped).
  local skips
  mapfile -t skips < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$build/ctest.part.log")
  if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped against the $kind LibTorch, and why:"
    skip_reasons "$junit"
  fi
  passed=$(( passed + total - f - ${#skips[@]} )); failed=$(( failed + f )); skipped=$(( skipped + ${#skips[@]} ))
}
for kind in "$default_libtorch_kind" "${others[@]}"; do
  build="$(build_dir "$kind")"
  if [ "$kind" = "$default_libtorch_kind" ]; then
    phase "build against the $kind LibTorch" bash scripts/setup.sh "$kind" || exit 1
    : > "$build/ctest.log"
    start=$SECONDS
    # What needs no Python first, while the references may still be installing.
    echo "== the suite against the $kind LibTorch ($build/): every test, first those that need no Python"
    run_ctest "$kind" -LE '^python$' "$@"
    await refs "Python references (.venv/)"
    echo "== the suite against the $kind LibTorch ($build/): the tests that need the Python references"
    run_ctest "$kind" -L '^python$' "$@"
  else
    await "build-$kind" "build against the $kind LibTorch"
    : > "$build/ctest.log"
    start=$SECONDS
    echo "== the suite against the $kind LibTorch ($build/): the tests labelled libtorch"
    run_ctest "$kind" -L '^libtorch$' "$@"
  fi
  note_phase "tests against the $kind LibTorch" "$start" "$SECONDS"
done

echo "== where the time went (wall time of each phase)"
printf '  %s\n' "${phases[@]}"
printf '  %-54s %5d s\n' "in all" $(( SECONDS - suite_start ))
echo "== the 10 slowest tests"
for kind in "${libtorch_kinds[@]}"; do
  log="$(build_dir "$kind")/ctest.log"
  [ -f "$log" ] && sed -n "s/.*Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec\$/\2 \1 ($kind)/p" "$log"
done | sort -rn | head -10 | awk '{ printf "  %7.1f s  %s %s\n", $1, $2, $3 }'
echo "both LibTorches (the line below counts tests of both runs):"
echo "total: $passed passed, $failed failed, $skipped skipped"
exit "$status"
