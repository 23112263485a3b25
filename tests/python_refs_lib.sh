#!/usr/bin/env bash
# Sourced by the tests that compare with the Python references
# (tests/hugging_face/*.sh, tests/text/chat_template_reference.sh), once
# $source (the checkout) is set: $python, skip and require_python.

# The test python: $FSDP_TEST_PYTHON, else the checkout's .venv (scripts/test.sh makes it).
python="${FSDP_TEST_PYTHON:-$source/.venv/bin/python}"

# skip "reason": exit 77 (ctest's skipped), or fail under CI, where every reference is installed.
skip() {
  echo "skipped: $*"
  [ -n "${CI:-}" ] && exit 1
  exit 77
}

# require_python MODULE...: the test python imports each, else skip.
require_python() {
  [ -x "$python" ] || skip "no test python ($python; scripts/test.sh makes it)"
  local imports
  imports=$(IFS=,; echo "$*")
  "$python" -c "import $imports" 2>/dev/null || skip "$python lacks one of: $*"
}
