# Sourced by setup.sh, main.sh and test.sh: the LibTorches fsdp-cpp is set up
# with, which is the default, and where each one's build lives.
default_libtorch_kind=debian      # the faster and leaner one here (README: Which LibTorch)
libtorch_kinds=(debian wheel)     # the ones scripts/test.sh runs the suite against
wheel_torch_version=2.15.0        # PyPI's torch, pinned
# What the suite compares against besides torch (scripts/python_refs.sh), pinned; peft (LoRA
# adapters) imports accelerate and psutil, pinned here so that nothing upgrades torch or transformers.
# jinja2 renders transformers' chat templates (tests/text/chat_template_reference.py).
# bitsandbytes quantizes NF4 on the CPU (tests/qlora/nf4_reference.py: our bytes against its).
python_reference_packages=(tokenizers==0.23.3 transformers==5.25.0 numpy==2.4.6 sentencepiece==0.2.3 peft==0.21.2 accelerate==1.16.0 psutil==7.2.2 jinja2==3.1.6 bitsandbytes==0.50.2)
# Downloaded, not installed (python_refs.sh into .venv/assets/): whisper's sdist carries GPT-2's real
# byte-level BPE (gpt2.tiktoken) and whisper's multilingual one, for tests/text/tiktoken_reference.py;
# llama-cpp-python's carries 70 hub chat templates (vendor/llama.cpp/models/templates/*.jinja), for
# tests/text/chat_template_reference.py.
python_reference_assets=(openai-whisper==20250625 llama-cpp-python==0.3.36)

# build_dir KIND: build/ for the default, build-KIND/ for another
# (FSDP_BUILD_DIR overrides).
build_dir() {
  if [ -n "${FSDP_BUILD_DIR:-}" ]; then echo "$FSDP_BUILD_DIR"
  elif [ "$1" = "$default_libtorch_kind" ]; then echo build
  else echo "build-$1"; fi
}

# venv_pip_install PACKAGE...: pip into .venv/ (made if missing), without pip's cache, so that
# nothing but .venv/ stays on disk (torch with its CUDA libraries unpacks to 5.6 GB). Refused up front, naming the bytes, where the disk cannot hold them: a
# full disk half-way through pip leaves a broken .venv/ and an error that names no cause.
venv_pip_free_bytes_needed=$(( 9 * 1024 * 1024 * 1024 ))  # 5.6 GB installed + the wheels while pip unpacks them
venv_pip_install() {
  local free_bytes
  free_bytes=$(( $(df -Pk . | awk 'NR == 2 { print $4 }') * 1024 ))
  if [ "$free_bytes" -lt "$venv_pip_free_bytes_needed" ]; then
    echo "pip into .venv/: needs about $venv_pip_free_bytes_needed bytes free on $(df -P . | awk 'NR == 2 { print $6 }'), found $free_bytes; free some space and run again" >&2
    return 1
  fi
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir "$@"
}
