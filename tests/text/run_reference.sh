#!/usr/bin/env bash
# ctest text_tokenizer_reference: tokenizer_reference.py with the test python
# ($FSDP_TEST_PYTHON, else the checkout's .venv); exits 77 (skipped) when
# there is none, unless CI is set.
#   run_reference.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" source="$2"
python="${FSDP_TEST_PYTHON:-$source/.venv/bin/python}"
if [ ! -x "$python" ]; then
  echo "skipped: no test python ($python; scripts/test.sh makes it)"
  [ -n "${CI:-}" ] && exit 1
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$python" "$source/tests/text/tokenizer_reference.py" "$build/fsdp-data" "$work" \
  "$source/data/default_corpus.txt" "$source/tests/fixtures/tokenizer-hostile.txt"
