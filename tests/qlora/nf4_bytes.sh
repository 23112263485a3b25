#!/usr/bin/env bash
# ctest qlora_nf4_bytes: fsdp-cpp's NF4 against bitsandbytes' (nf4_reference.py),
# with the test python ($FSDP_TEST_PYTHON, else the checkout's .venv);
# exits 77 (skipped) without it or without bitsandbytes, unless CI is set.
#   nf4_bytes.sh SOURCE_DIR NF4_CHECK
set -euo pipefail
source="$1" checker="$2"
source "$source/tests/python_refs_lib.sh"
require_python torch bitsandbytes safetensors
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export TORCHDYNAMO_DISABLE=1  # bitsandbytes compiles its portable kernels otherwise: 45 s, not 10
exec "$python" "$source/tests/qlora/nf4_reference.py" --checker "$checker" --work "$work" 2> >(grep -v kernels-community >&2)
