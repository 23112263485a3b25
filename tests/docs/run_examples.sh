#!/usr/bin/env bash
# The docs' examples, as a reader would use them.
#
#   run_examples.sh [--includes-only] BUILD_DIR [PAGE...]
#
# Reads README.md and docs/*.md (or the PAGEs given, relative to the checkout):
# - every ```cpp and ```cmake block must come right after a marker
#     <!-- include: examples/FILE -->             (the whole file)
#     <!-- include: examples/FILE lines A-B -->   (lines A to B of it)
#   and be exactly that text; a block that differs fails, with the diff;
# - every ```sh block runs, in order, with `bash -e -o pipefail`, in a scratch
#   folder (one per page; two pages at a time) where build/ is BUILD_DIR and data/, scripts/,
#   tools/, bench/ and examples/ are the checkout's. A block that exits
#   non-zero fails the run, named by page and line. A block that cannot run
#   here is marked right before it with
#     <!-- not run in the suite: REASON -->
#   and listed with its page, line and reason;
# - ```text, ```json and the other kinds are not run; ```bash, ```shell and
#   ```console are refused (write ```sh, so that every command is run or marked).
# - every relative link leads to a file, and its #anchor to a heading there.
# With --includes-only only the includes and the links are checked
# (docs_cpp_examples).
set -uo pipefail

includes_only=0
if [ "${1:-}" = "--includes-only" ]; then includes_only=1; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 [--includes-only] BUILD_DIR [PAGE...]" >&2; exit 2; }
build=$(cd "$1" && pwd) || { echo "run_examples: no build folder '$1'" >&2; exit 2; }
shift
checkout=$(cd "$(dirname "$0")/../.." && pwd)
cd "$checkout" || exit 2

if [ $# -gt 0 ]; then pages=("$@"); else pages=(README.md docs/*.md); fi
work=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-docs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Cut every fenced block of a page into $work/blocks/<page>.<n>.{meta,body}.
# meta: the page, the fence's line, the block's kind, the marker before it
# (the nearest non-blank line, when it is an HTML comment).
mkdir -p "$work/blocks"
for page in "${pages[@]}"; do
  [ -f "$page" ] || { echo "run_examples: no page '$page'" >&2; exit 2; }
  awk -v page="$page" -v out="$work/blocks/$(echo "$page" | tr / _)" '
    function flush_marker() { marker = "" }
    !in_block && /^```[a-z]*[ \t]*$/ {
      in_block = 1; n++; kind = substr($0, 4); sub(/[ \t]+$/, "", kind)
      body = sprintf("%s.%03d.body", out, n)
      printf "%s\t%d\t%s\t%s\n", page, NR, kind, marker > sprintf("%s.%03d.meta", out, n)
      printf "" > body
      next
    }
    in_block && /^```[ \t]*$/ { in_block = 0; close(body); marker = ""; next }
    in_block { print > body; next }
    /^[ \t]*$/ { next }
    /^<!--.*-->[ \t]*$/ { marker = $0; next }
    { marker = "" }
    END { if (in_block) { printf "%s:%d: a fence is never closed\n", page, NR > "/dev/stderr"; exit 1 } }
  ' "$page" || exit 1
done

failures=()
not_run=()

# Links between the pages: every relative link's file exists, and its
# #anchor is a heading of that page (GitHub's ids: lower case, punctuation
# dropped, spaces as hyphens).
anchors_of() {
  awk '/^```/ { fenced = !fenced; next }
       !fenced && /^#+ / { sub(/^#+ /, ""); s = tolower($0); gsub(/[^a-z0-9 _-]/, "", s); gsub(/ /, "-", s); print s }' "$1"
}
for page in "${pages[@]}"; do
  while IFS=: read -r line target; do
    case "$target" in http://*|https://*|mailto:*) continue ;; esac
    file=${target%%#*} anchor=""
    [[ "$target" == *"#"* ]] && anchor=${target#*#}
    if [ -z "$file" ]; then path=$page; else path=$(dirname "$page")/$file; fi
    if [ ! -e "$path" ]; then
      failures+=("$page:$line: a link to $target, and there is no $path"); continue
    fi
    if [ -n "$anchor" ] && ! anchors_of "$path" | grep -qxF -- "$anchor"; then
      failures+=("$page:$line: a link to $target, and $path has no heading with that id")
    fi
  done < <(awk '/^```/ { fenced = !fenced; next }
                !fenced {
                  # Drop inline code, which may run on from the line before.
                  s = ""; rest = $0
                  while ((i = index(rest, "`")) > 0) {
                    if (!in_code) s = s substr(rest, 1, i - 1)
                    in_code = !in_code; rest = substr(rest, i + 1)
                  }
                  if (!in_code) s = s rest
                  while (match(s, /\]\([^)]+\)/)) { print NR ":" substr(s, RSTART + 2, RLENGTH - 3); s = substr(s, RSTART + RLENGTH) } }
                /^[ \t]*$/ { in_code = 0 }' "$page")
done
ran=0
checked=0
start_all=$SECONDS

# The scratch folder of a page: the build and the checkout's folders a command names.
scratch_for() {
  local dir="$work/run/$(echo "$1" | tr / _)"
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir"
    ln -s "$build" "$dir/build"
    for folder in data scripts tools bench examples; do ln -s "$checkout/$folder" "$dir/$folder"; done
  fi
  echo "$dir"
}

mkdir -p "$work/queue" "$work/report"
for meta in "$work"/blocks/*.meta; do
  [ -e "$meta" ] || continue
  IFS=$'\t' read -r page line kind marker < "$meta"
  body="${meta%.meta}.body"
  where="$page:$line"
  case "$kind" in
    cpp|cmake)
      if [[ ! "$marker" =~ ^\<!--\ include:\ ([^ ]+)(\ lines\ ([0-9]+)-([0-9]+))?\ --\>$ ]]; then
        failures+=("$where: a \`\`\`$kind block without <!-- include: examples/FILE [lines A-B] --> before it")
        continue
      fi
      file=${BASH_REMATCH[1]} first=${BASH_REMATCH[3]} last=${BASH_REMATCH[4]}
      if [ ! -f "$file" ]; then
        failures+=("$where: includes $file, which does not exist"); continue
      fi
      if [ -n "$first" ]; then expected=$(sed -n "${first},${last}p" "$file"); else expected=$(cat "$file"); fi
      if ! diff_out=$(diff <(printf '%s\n' "$expected") "$body"); then
        echo "--- $where: the block differs from $file${first:+ lines $first-$last} (< file, > page):"
        echo "$diff_out" | head -40
        failures+=("$where: differs from $file${first:+ lines $first-$last}")
      fi
      checked=$((checked + 1))
      ;;
    bash|shell|console)
      failures+=("$where: a \`\`\`$kind block: write \`\`\`sh (run or marked not run) or \`\`\`text")
      ;;
    sh)
      [ "$includes_only" = 1 ] && continue
      if [[ "$marker" =~ ^\<!--\ not\ run\ in\ the\ suite:\ (.*)\ --\>$ ]]; then
        not_run+=("$where: ${BASH_REMATCH[1]}")
        continue
      fi
      printf '%s\t%s\n' "$body" "$where" >> "$work/queue/$(echo "$page" | tr / _)"
      ;;
  esac
done

# Run one page's blocks in order, in its scratch folder (a block may use what
# the one before it wrote); the report and the failures go to files.
run_page() {
  local queue=$1 name dir body where started status
  name=$(basename "$queue")
  dir=$(scratch_for "$name")
  while IFS=$'\t' read -r body where; do
    started=$SECONDS
    # stdin from /dev/null: mpirun forwards its stdin to rank 0, which would eat the queue.
    (cd "$dir" && timeout -k 5 180 bash -e -o pipefail "$body") < /dev/null > "$body.out" 2>&1
    status=$?
    if [ $status -ne 0 ]; then
      { echo "--- $where: exited with status $status; the block:"
        sed 's/^/    /' "$body"
        echo "--- its output (the last 40 lines):"
        tail -40 "$body.out"; } >> "$work/report/$name"
      echo "$where: exited with status $status" >> "$work/report/$name.failed"
    else
      echo "ran $where ($((SECONDS - started)) s)" >> "$work/report/$name"
    fi
  done < "$queue"
}

# The pages two at a time (FSDP_DOCS_JOBS), as ctest gives this test 2 processors.
jobs=${FSDP_DOCS_JOBS:-2}
for queue in "$work"/queue/*; do
  [ -e "$queue" ] || continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_page "$queue" &
done
wait
for queue in "$work"/queue/*; do
  [ -e "$queue" ] || continue
  name=$(basename "$queue")
  cat "$work/report/$name"
  ran=$((ran + $(grep -c '^ran ' "$work/report/$name") + $(cat "$work/report/$name.failed" 2>/dev/null | wc -l)))
  if [ -f "$work/report/$name.failed" ]; then
    while read -r entry; do failures+=("$entry"); done < "$work/report/$name.failed"
  fi
done

for entry in "${not_run[@]+"${not_run[@]}"}"; do echo "not run: $entry"; done
echo "docs: $checked included block(s) checked, $ran shell block(s) run, ${#not_run[@]} not run, $((SECONDS - start_all)) s"
if [ ${#failures[@]} -gt 0 ]; then
  for entry in "${failures[@]}"; do echo "FAILED: $entry"; done
  exit 1
fi
exit 0
