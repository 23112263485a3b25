#!/usr/bin/env bash
# CMake refuses one LibTorch's headers with another's libraries, naming both:
# CMAKE_PREFIX_PATH at the wheel's share/cmake on a machine with Debian's
# libtorch-dev pairs the wheel's headers with Debian's libtorch.so unless
# the build checks. And FSDP_LIBTORCH must name a LibTorch folder.
source "$(dirname "$0")/lib.sh" "$@"
src="$(cd "$here/../.." && pwd)"
wheel=$("$src/.venv/bin/python" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
if [ -z "$wheel" ] || [ ! -e /usr/lib/x86_64-linux-gnu/libtorch.so ]; then
  echo "skipped: needs both the wheel's LibTorch (.venv) and Debian's libtorch-dev (scripts/test.sh installs both)"
  pass
fi
# cmake_error WANT... -- CMAKE ARGS: configuring fails, and its message (CMake
# wraps it over lines: joined here) holds every WANT.
cmake_error() {
  local wants=() out
  while [ "$1" != "--" ]; do wants+=("$1"); shift; done
  shift
  out=$(cmake "$@" 2>&1) && { echo "$out"; fail "cmake $* succeeded"; }
  out=$(tr -s ' \n' ' ' <<<"$out")
  for want in "${wants[@]}"; do
    grep -qF -- "$want" <<<"$out" || { echo "$out"; fail "CMake's message lacks '$want'"; }
    echo "ok: '$want'"
  done
}
cmake_error "LibTorch's headers and CMake files come from $(realpath "$wheel")" \
  "its library TORCH_LIBRARY was found at /usr/lib/x86_64-linux-gnu/libtorch.so" -- \
  -S "$src" -B "$work/mismatch" -DCMAKE_PREFIX_PATH="$wheel/share/cmake"
cmake_error "FSDP_LIBTORCH=$work holds no share/cmake/Torch/TorchConfig.cmake" -- -S "$src" -B "$work/nowhere" -DFSDP_LIBTORCH="$work"
pass
