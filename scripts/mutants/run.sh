#!/usr/bin/env bash
# Mutation testing: each patch in this folder makes one deliberate mistake in
# the library or the tools. For each, this script applies the patch to a
# source tree, builds only the targets its tests need, runs the ctest entries
# that should catch the mistake, and reverts the patch (always: also on a
# failure or Ctrl-C). A mutation the tests let pass is a hole in the suite.
#
#   scripts/mutants/run.sh SOURCE_TREE BUILD_DIR [NAME...]
#
# SOURCE_TREE  a git checkout (a worktree of its own is best: the patches are
#              applied there while the tests run)
# BUILD_DIR    a build folder configured from SOURCE_TREE (cmake -S SOURCE_TREE
#              -B BUILD_DIR -DCMAKE_BUILD_TYPE=Release)
# NAME         mutations to run: a patch's name, its name without the number,
#              or its number (01-reduce-scatter-sum, reduce-scatter-sum, 01);
#              default all
#
# One line per mutation: "killed by <the ctest entries that failed>" or
# "SURVIVED"; the exit status is non-zero if any survived (or could not be
# built or tested). Logs in BUILD_DIR/mutants/NAME.{build,test}.log.
# Environment: MUTANT_JOBS (build jobs, 2), MUTANT_TIMEOUT (seconds per ctest
# entry, 600: ctest's --timeout for entries without a TIMEOUT of their own,
# and the whole ctest run is ended after that many seconds per entry; a run
# ended so counts as killed, by "timeout"), MUTANT_NICE (nice level of builds
# and tests, 10),
# MUTANT_RESTORE=0 to leave the build folder as the last mutant built it
# (by default the targets built are rebuilt unmutated at the end).
# Refuses a tree with uncommitted changes to a file a selected patch touches.
# The fuzz entries (fuzz_*) need clang (scripts/setup.sh installs it).
set -uo pipefail

# NAME | ctest regex (the entries that should catch it; it may hold "|") | build targets.
# The targets: the tests' executables, and for the trainer cases the programs
# they run (fsdp-run comes with configuring; it runs fsdp-cma-probe).
trainer="fsdp-train fsdp-ckpt fsdp-plan fsdp-cma-probe"
mutations=(
  "01-reduce-scatter-sum|^sharding_and_memory_w3$|mpi_tests"
  "02-full-gradients-all-reduce-sum|^sharding_and_memory_w3$|mpi_tests"
  "03-hybrid-replica-all-reduce-sum|^sharding_and_memory_w3$|mpi_tests"
  "04-gradient-padding-not-zeroed-copying-path|^sharding_and_memory_w3$|mpi_tests"
  "05-gradient-padding-not-zeroed-sharded-path|^sharding_and_memory_w3$|mpi_tests"
  "06-parameter-padding-not-zeroed|^sharding_and_memory_w3$|mpi_tests"
  "07-shard-offset-without-padding|^trainer_equivalence$|$trainer"
  "08-checkpoint-load-without-min|^trainer_checkpoint$|$trainer"
  "09-ckpt-keep-one-more|^trainer_ckpt-keep$|$trainer"
  "10-init-from-skips-one-tensor|^trainer_save-and-init$|$trainer"
  "11-no-sync-drops-earlier-gradients|^trainer_no-sync$|$trainer"
  "12-fp16-gradients-not-unscaled|^trainer_reduce-dtype$|$trainer"
  "13-stuck-group-destructor-joins|^trainer_watchdog$|$trainer watchdog_probe"
  "14-reduced-gradients-negated|^trainer_example$|example-mlp fsdp-cma-probe"
  "15-limiter-allows-two-in-backward|^state_machine_prefetch_ac_w2$|mpi_tests"
  "16-limiter-off-by-one|^state_machine_prefetch_ac_w2$|mpi_tests"
  "17-no-finish-reductions-before-recompute|^(state_machine_prefetch_ac_w2|trainer_activation-checkpointing)$|mpi_tests $trainer"
  "18-sharded-init-materializes-whole-model|^trainer_sharded-init$|$trainer"
  "19-async-collective-made-synchronous|^collectives_w2$|mpi_tests"
  "20-half-sum-skips-last-element|^collectives_w2$|mpi_tests"
  "21-planner-forgets-prefetched-unit|^trainer_planner$|$trainer"
  "22-reader-range-check-removed|^fuzz_safetensors_reader$|fsdp fsdp-ckpt"
  "23-metadata-numel-check-removed|^fuzz_checkpoint_metadata$|fsdp fsdp-ckpt"
  "24-nvme-skips-empty-shard|^trainer_nvme-offload$|$trainer"
  "25-read-ahead-by-queue-length|^trainer_nvme-offload$|$trainer"
  "26-packed-attention-reads-across-conversations|^conversations$|unit_tests"
  "27-loss-mean-per-micro-batch|^trainer_conversations$|$trainer fsdp-data"
  "28-learned-positions-do-not-restart|^conversations$|unit_tests"
  "29-answer-header-trained|^hugging_face_chat_ids$|fsdp-data"
  "30-packed-targets-read-the-inputs-mask|^conversations$|unit_tests"
  "31-nf4-ties-round-up|^qlora_nf4_bytes$|nf4_check"
  "32-nf4-nested-offset-dropped|^qlora_bnb_folder$|$trainer"
  "33-nf4-records-not-gathered|^frozen_parameters_w2$|mpi_tests"
)

here="$(cd "$(dirname "$0")" && pwd)"
usage() { sed -n '8,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
src="$(cd "$1" && pwd)" || exit 2
build="$(cd "$2" && pwd)" || exit 2
shift 2
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 || { echo "mutants: $src is not a git checkout" >&2; exit 2; }
[ -f "$build/CTestTestfile.cmake" ] || { echo "mutants: $build is not a configured build folder" >&2; exit 2; }
configured_from="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")"
[ "$(cd "$configured_from" 2>/dev/null && pwd)" = "$src" ] ||
  { echo "mutants: $build was configured from '$configured_from', not $src" >&2; exit 2; }
jobs="${MUTANT_JOBS:-2}" timeout="${MUTANT_TIMEOUT:-600}" niceness="${MUTANT_NICE:-10}"
logs="$build/mutants"
mkdir -p "$logs"

# The selected rows.
selected=()
if [ $# -eq 0 ]; then
  selected=("${mutations[@]}")
else
  for want in "$@"; do
    found=""
    for row in "${mutations[@]}"; do
      name="${row%%|*}"
      if [ "$want" = "$name" ] || [ "$want" = "${name#[0-9][0-9]-}" ] || [ "$want" = "${name%%-*}" ]; then found="$row"; fi
    done
    [ -n "$found" ] || { echo "mutants: no mutation '$want' (see the table at the top of $0)" >&2; exit 2; }
    selected+=("$found")
  done
fi

# Every patch applies, and touches only committed files.
for row in "${selected[@]}"; do
  name="${row%%|*}" patch="$here/${row%%|*}.patch"
  [ -f "$patch" ] || { echo "mutants: $patch is missing" >&2; exit 2; }
  mapfile -t files < <(git -C "$src" apply --numstat "$patch" | cut -f3)
  dirty="$(git -C "$src" status --porcelain -- "${files[@]}")"
  [ -z "$dirty" ] || { echo "mutants: $src has uncommitted changes to a file $name patches; commit them first:" >&2
                       echo "$dirty" >&2; exit 2; }
  git -C "$src" apply --check "$patch" 2>/dev/null ||
    { echo "mutants: $name.patch does not apply to $src (has the code moved? remake the patch)" >&2; exit 2; }
done

applied=""  # the patch applied now, reverted by the trap
revert() {
  [ -n "$applied" ] || return 0
  git -C "$src" apply -R "$applied" || echo "mutants: could not revert $applied in $src: revert it by hand" >&2
  applied=""
}
# A command in a process group of its own, ended (with everything it
# started: mpirun and its ranks) after LIMIT seconds or on Ctrl-C.
running=""
stop_running() {
  [ -n "$running" ] || return 0
  kill -TERM -- "-$running" 2>/dev/null
  sleep 2
  kill -KILL -- "-$running" 2>/dev/null
  running=""
}
bounded() {  # LIMIT LOG COMMAND...: the command's status; 124 when it ran out of time
  local limit="$1" log="$2" start=$SECONDS rc; shift 2
  setsid nice -n "$niceness" "$@" >"$log" 2>&1 &
  running=$!
  while kill -0 "$running" 2>/dev/null && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 1; done
  if kill -0 "$running" 2>/dev/null; then
    stop_running
    wait 2>/dev/null
    echo "mutants: ended after $limit s" >>"$log"
    return 124
  fi
  wait "$running"; rc=$?
  running=""
  return $rc
}
trap 'stop_running; revert' EXIT
trap 'stop_running; revert; echo "mutants: interrupted" >&2; exit 130' INT TERM

# The build's targets (a row may name targets of older or newer trees: only
# those this tree has are built; all where the generator cannot list them).
known_targets=" $(cmake --build "$build" --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p' | paste -sd' ') "
all_targets=""
bad=0
results=()
report() { results+=("$1"); echo "$1"; }
# What failed, from a test log: the gtest cases, the trainer cases' FAIL
# lines, a fuzz target's own complaint or a sanitizer's error (three at most).
why() {
  local lines
  lines="$(sed 's/\x1b\[[0-9;]*m//g' "$1" |
           grep -E '^\[  FAILED  \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+ \(|^FAIL: |^[a-z]+_fuzz: |^==[0-9]+==ERROR: ' |
           sed 's/^\[  FAILED  \] \([^ ]*\) (.*/\1/; s/^==[0-9]*==//' | awk '!seen[$0]++' | head -3 | paste -sd'|' | sed 's/|/; /g')"
  [ -z "$lines" ] || echo ": $lines"
}
for row in "${selected[@]}"; do
  # The regex may hold "|": the name is the first field, the targets the last.
  name="${row%%|*}" rest="${row#*|}"
  regex="${rest%|*}" targets="${rest##*|}"
  start=$SECONDS
  entries=$(cd "$build" && ctest -N -R "$regex" | grep -c '^ *Test *#')
  if [ "$entries" -eq 0 ]; then
    report "$name: NO TESTS match '$regex' (the ctest names changed? update the table in $0)"
    bad=1
    continue
  fi
  present=""
  for t in $targets; do [[ -z "${known_targets// }" || "$known_targets" == *" $t "* ]] && present+=" $t"; done
  if [ -z "$present" ]; then
    report "$name: none of the targets '$targets' is in $build (renamed? update the table in $0)"
    bad=1
    continue
  fi
  targets="$present"
  all_targets+=" $targets"
  git -C "$src" apply "$here/$name.patch" || { report "$name: the patch failed to apply"; bad=1; continue; }
  applied="$here/$name.patch"
  # shellcheck disable=SC2086  # the targets are words
  if ! nice -n "$niceness" cmake --build "$build" -j "$jobs" --target $targets >"$logs/$name.build.log" 2>&1; then
    revert
    report "$name: BUILD FAILED (the mutant does not compile: $logs/$name.build.log)"
    bad=1
    continue
  fi
  # One slot more than the entries: a fixture's setup (fuzz_build) runs too.
  bounded $((timeout * (entries + 1))) "$logs/$name.test.log" \
    ctest --test-dir "$build" -R "$regex" --timeout "$timeout" --output-on-failure
  status=$?
  revert
  seconds=$((SECONDS - start))
  # ctest lists the failures as "  12 - name (Failed)", "(Timeout)", ...
  failed="$(sed -n '/The following tests FAILED:/,$s/^[[:space:]]*[0-9]* - \([^ ]*\) (\(.*\))$/\1 (\2)/p' \
            "$logs/$name.test.log" | paste -sd',' | sed 's/,/, /g')"
  if [ -n "$failed" ]; then
    report "$name: killed by $failed (${seconds} s)$(why "$logs/$name.test.log")"
  elif [ "$status" -eq 124 ]; then
    report "$name: killed by timeout (ctest ran past $((timeout * (entries + 1))) s; ${seconds} s)"
  elif [ "$status" -ne 0 ]; then
    report "$name: ctest failed without naming a test (exit $status: $logs/$name.test.log; ${seconds} s)"
    bad=1
  else
    report "$name: SURVIVED ($regex passed; ${seconds} s)"
    bad=1
  fi
done

# The build folder back to the unmutated source.
if [ "${MUTANT_RESTORE:-1}" = 1 ] && [ -n "$all_targets" ]; then
  # shellcheck disable=SC2086
  nice -n "$niceness" cmake --build "$build" -j "$jobs" --target $(tr ' ' '\n' <<<"$all_targets" | sort -u) \
    >"$logs/restore.build.log" 2>&1 || { echo "mutants: rebuilding the unmutated targets failed: $logs/restore.build.log" >&2; bad=1; }
fi
echo
echo "mutants: $(printf '%s\n' "${results[@]}" | grep -c ': killed by') of ${#selected[@]} killed"
printf '%s\n' "${results[@]}"
exit $bad
