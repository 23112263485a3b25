#!/usr/bin/env bash
# Installs what fsdp-cpp needs (Debian's packages, as root; PyPI's torch into
# .venv/ for the wheel's LibTorch), builds it, and makes the built-in default
# corpus. Safe to run again: each step is skipped when already done.
#
#   scripts/setup.sh [wheel|debian] [--packages]
#
#   wheel   LibTorch 2.x from PyPI's torch wheel (pinned in libtorch_kinds.sh)
#   debian  Debian's libtorch-dev 1.13
#   --packages  only install that kind's Debian packages (scripts/test.sh does
#           this first for both, so that its builds can run side by side
#           without two apt-gets at once)
# The default (scripts/libtorch_kinds.sh) builds into build/, the other into
# build-<kind>/. FSDP_LIBTORCH_KIND picks the kind when no argument is given;
# FSDP_BUILD_DIR overrides the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh

kind="${1:-${FSDP_LIBTORCH_KIND:-$default_libtorch_kind}}"
packages_only=0
[ "${2:-}" = --packages ] && packages_only=1
case "$kind" in
  wheel|debian) ;;
  *) echo "setup: unknown LibTorch '$kind' (expected wheel or debian)" >&2; exit 2 ;;
esac
build="$(build_dir "$kind")"
torch_version="$wheel_torch_version"

packages=(build-essential cmake libopenblas0-pthread libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libcli11-dev libxxhash-dev libaio-dev libonig-dev libicu-dev libgtest-dev clang libclang-rt-14-dev procps jq bsdextrautils gnuplot-nox
          iproute2 util-linux  # iproute2: ip netns and tc for the multi-host tests
          doxygen              # the API reference (the docs target, the docs_api_reference test)
          universal-ctags      # the count of public names (the public_names test)
          ccache)              # the compiler cache (below)
if [ "$kind" = debian ]; then packages+=(libtorch-dev); else packages+=(python3-venv python3-pip); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
[ $packages_only = 0 ] || exit 0

libtorch=""  # Debian's: CMake's own search finds it
if [ "$kind" = wheel ]; then
  # A virtual environment inside the checkout (ignored by git) holds the
  # wheel; its torch/ folder is the LibTorch (headers, libraries, CMake files).
  if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    echo "setup: installing torch==$torch_version from PyPI into .venv/ (a few GB with its CUDA libraries)"
    venv_pip_install "torch==$torch_version"
  fi
  libtorch="$(.venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)"
fi
# A build folder configured for another LibTorch keeps that one's cached
# paths: start it afresh.
if [ -f "$build/CMakeCache.txt" ] && [ "$(sed -n 's/^FSDP_LIBTORCH:PATH=//p' "$build/CMakeCache.txt")" != "$libtorch" ]; then
  echo "setup: $build/ was configured for another LibTorch; rebuilding it"
  rm -rf "$build"
fi

# The default corpus: real English prose that every Debian system carries
# (the licence texts of base-files), concatenated in a fixed order.
corpus=data/default_corpus.txt
if [ ! -s "$corpus" ]; then
  mkdir -p data
  licenses=(GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 MPL-2.0 MPL-1.1 GFDL-1.3 GFDL-1.2 Artistic CC0-1.0 BSD GPL-1 LGPL-2)
  for l in "${licenses[@]}"; do cat "/usr/share/common-licenses/$l"; echo; done > "$corpus.tmp"
  mv "$corpus.tmp" "$corpus"
fi

# The compiler cache, outside the checkout (ccache's own default,
# ~/.cache/ccache, or CCACHE_DIR): a build of a tree this machine has built
# before, in any clone, compiles nothing again. base_dir makes the paths
# inside the checkout relative, so clones in other folders share entries;
# pch_defines and time_macros let it cache the files that use the
# precompiled header (ccache's manual, "Precompiled headers"); a fresh
# clone's files are all new, hence include_file_mtime/ctime. FSDP_CCACHE=0
# builds without it.
launcher=()
if [ "${FSDP_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=/usr/bin/env;CCACHE_BASEDIR=$PWD;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G};ccache")
fi
log="$build.log"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSDP_LIBTORCH="$libtorch" "${launcher[@]}" > "$log" 2>&1 || { cat "$log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >> "$log" 2>&1 || { tail -50 "$log"; exit 1; }
echo "setup: built $build/ against LibTorch $(sed -n 's/^-- fsdp-cpp: LibTorch \(.*\)/\1/p' "$log" | tail -1) (log in $log)"
