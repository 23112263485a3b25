#!/usr/bin/env bash
# ctest text_chat_templates (chat_template_reference.py): our renderer against
# transformers on the hub templates in $FSDP_TEST_ASSETS/chat_templates (else
# the checkout's .venv/assets/chat_templates, which scripts/python_refs.sh
# extracts from llama-cpp-python's sdist), with the test python
# ($FSDP_TEST_PYTHON, else the checkout's .venv); exits 77 (skipped) when
# either is missing, unless CI is set.
#   chat_template_reference.sh BUILD_DIR SOURCE_DIR CHECKER
set -euo pipefail
build="$1" source="$2" checker="$3"
source "$source/tests/python_refs_lib.sh"
templates="${FSDP_TEST_ASSETS:-$source/.venv/assets}/chat_templates"
require_python transformers jinja2
compgen -G "$templates/*.jinja" > /dev/null || skip "no chat templates in $templates (scripts/python_refs.sh extracts them)"
[ -x "$checker" ] || { echo "FAIL: no checker at $checker (build dir $build)" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec "$python" "$source/tests/text/chat_template_reference.py" --checker "$checker" --templates "$templates"
