#!/usr/bin/env bash
# ctest text_tokenizer_reference (tokenizer_reference.py) and
# text_tokenizer_real_vocab (tiktoken_reference.py, with the asset folder
# $FSDP_TEST_ASSETS, else the checkout's .venv/assets/) with the test python
# ($FSDP_TEST_PYTHON, else the checkout's .venv); exits 77 (skipped) when
# there is none, unless CI is set.
#   run_reference.sh BUILD_DIR SOURCE_DIR [SCRIPT=tokenizer_reference.py]
set -euo pipefail
build="$1" source="$2" script="${3:-tokenizer_reference.py}"
assets=()
[ "$script" = tiktoken_reference.py ] && assets=("${FSDP_TEST_ASSETS:-$source/.venv/assets}")
python="${FSDP_TEST_PYTHON:-$source/.venv/bin/python}"
if [ ! -x "$python" ]; then
  echo "skipped: no test python ($python; scripts/test.sh makes it)"
  [ -n "${CI:-}" ] && exit 1
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$python" "$source/tests/text/$script" "$build/fsdp-data" "$work" "${assets[@]}" \
  "$source/data/default_corpus.txt" "$source/tests/fixtures/tokenizer-hostile.txt"
