#!/usr/bin/env bash
# The Python references the suite compares against: PyPI's torch (the wheel's
# LibTorch, pinned in libtorch_kinds.sh), Hugging Face's tokenizers and
# transformers, and sentencepiece (the tokenizer tests train SentencePiece
# models), in .venv/ inside the checkout (ignored by git; setup.sh's
# wheel build uses the same one). Safe to run again: skipped when installed.
# Called by scripts/test.sh, which then points FSDP_TEST_PYTHON at it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh
refs=("torch==$wheel_torch_version" "${python_reference_packages[@]}")
# fetch_assets: the pinned sdists' assets into .venv/assets/ (pip download --no-deps), once:
# whisper's *.tiktoken files, and llama-cpp-python's hub chat templates into chat_templates/.
fetch_assets() {
  [ -f .venv/assets/gpt2.tiktoken ] && [ -f .venv/assets/multilingual.tiktoken ] \
    && compgen -G '.venv/assets/chat_templates/*.jinja' > /dev/null && return 0
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d .venv/assets "${python_reference_assets[@]}"
  mkdir -p .venv/assets/chat_templates
  for sdist in .venv/assets/*.tar.gz; do
    case "$(basename "$sdist")" in
      llama_cpp_python-*|llama-cpp-python-*)
        tar -xzf "$sdist" -C .venv/assets/chat_templates --wildcards --no-anchored --strip-components=5 \
          'vendor/llama.cpp/models/templates/*.jinja' ;;
      *) tar -xzf "$sdist" -C .venv/assets --wildcards --no-anchored --strip-components=3 'whisper/assets/*.tiktoken' ;;
    esac
  done
}
if .venv/bin/python - "${refs[@]}" <<'PY' 2>/dev/null; then fetch_assets; exit 0; fi
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    if version(name).split("+")[0] != wanted:
        sys.exit(1)
PY
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
for p in python3-venv python3-pip; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    $SUDO apt-get update -q; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv python3-pip; break; }
done
echo "python_refs: installing ${refs[*]} into .venv/ (a few GB with torch's CUDA libraries)"
venv_pip_install "${refs[@]}"
fetch_assets
