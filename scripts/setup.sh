#!/usr/bin/env bash
# Installs what fsdp-cpp needs from Debian's packages (as root), builds it in
# build/, and makes the built-in default corpus. Safe to run again: each step
# is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake libtorch-dev libopenblas0-pthread libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libcli11-dev libgtest-dev clang libclang-rt-14-dev procps jq bsdextrautils gnuplot-nox)
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

# The default corpus: real English prose that every Debian system carries
# (the licence texts of base-files), concatenated in a fixed order.
corpus=data/default_corpus.txt
if [ ! -s "$corpus" ]; then
  mkdir -p data
  licenses=(GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 MPL-2.0 MPL-1.1 GFDL-1.3 GFDL-1.2 Artistic CC0-1.0 BSD GPL-1 LGPL-2)
  for l in "${licenses[@]}"; do cat "/usr/share/common-licenses/$l"; echo; done > "$corpus.tmp"
  mv "$corpus.tmp" "$corpus"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)" >> build.log 2>&1 || { tail -50 build.log; exit 1; }
echo "setup: built build/fsdp-train, build/fsdp-run and the tests (log in build.log)"
