#!/usr/bin/env bash
# Fills .gpu-carry/ (ignored by git) with what the GPU machine lacks to build
# and run fsdp-cpp: Debian 12's OpenMPI and the libraries it loads, the
# header-only and test dependencies, jq, and the built-in corpus. Run here
# (Debian 12, with apt's lists), as root; scripts/gpu_check.sh unpacks it
# there with dpkg -x into a private prefix. The device tool carries at most
# 64 MiB in all: this stays far under (the size is printed at the end).
#
#   bash scripts/gpu_carry.sh        then, with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=560)
# The GPU image keeps its own libraries: gpu_check.sh prunes a carried
# dependency whose sonames the image has, and runs python (torch) with the
# caller's LD_LIBRARY_PATH, never the prefix's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
carry=.gpu-carry
limit_mib=48  # of the tool's 64 MiB: the rest is the working tree itself

die() { echo "gpu_carry: $*" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "expected Debian's apt-get and dpkg-deb, found none"
[ "$(dpkg --print-architecture)" = amd64 ] || die "expected an amd64 Debian (the GPU machine is x86-64), found $(dpkg --print-architecture)"
# apt-get download needs the package lists; a fresh container may have none.
if ! ls /var/lib/apt/lists/*Packages* >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "apt has no package lists and updating them needs root"
  apt-get update -q || die "apt-get update failed"
fi

# What the build and its tests use (CMakeLists.txt's find_package calls, the
# tests' jq), beside OpenMPI itself.
seeds=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15
       libevent-core-2.1-7 libevent-pthreads-2.1-7
       nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0 libaio-dev libaio1 libgtest-dev jq libjq1 libonig5)
# Never carried: the C/C++ runtime every image has, newer there (Ubuntu 24.04)
# than here; a Debian 12 copy on LD_LIBRARY_PATH would only shadow it.
never=" libc6 libgcc-s1 libstdc++6 zlib1g libzstd1 liblzma5 libbz2-1.0 libcrypt1 libselinux1 libpcre2-8-0 libssl3 libudev1 libsystemd0 "

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$carry.new"
mkdir -p "$carry.new"
# download PKG...: into $carry.new, unpacked into $work/root for the scan.
download() {
  (cd "$carry.new" && apt-get download -q "$@" 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
    die "apt-get download $* failed (expected packages of Debian 12's archive)"
  for p in "$@"; do dpkg -x "$carry.new/${p}_"*.deb "$work/root" || die "dpkg -x of $p failed"; done
}
declare -A have=()
queue=("${seeds[@]}")
# The closure over DT_NEEDED: every ELF file carried (programs, libraries,
# OpenMPI's and PMIx's dlopen'ed components) names the sonames it needs; the
# package owning each (here, by dpkg -S) is carried too unless in $never.
# Components whose libraries are missing would only be skipped by OpenMPI,
# but carrying them (UCX, libfabric, PSM2, verbs) keeps its log quiet.
while [ ${#queue[@]} -gt 0 ]; do
  new=()
  for p in "${queue[@]}"; do [ -n "${have[$p]:-}" ] || { have[$p]=1; new+=("$p"); }; done
  [ ${#new[@]} -gt 0 ] || break
  echo "gpu_carry: downloading ${new[*]}"
  download "${new[@]}"
  queue=()
  while read -r soname; do
    path=$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ { print $NF; exit }')
    [ -n "$path" ] || { find "$work/root" -name "$soname" | grep -q . && continue
                        die "no package here provides $soname (needed by a carried file): install it or add its package to the seeds"; }
    owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$owner" ] || owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$owner" ] || die "no installed package owns $path ($soname)"
    [[ "$never" == *" $owner "* ]] || queue+=("$owner")
  done < <(find "$work/root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
             'readelf -d "$1" 2>/dev/null | sed -n "s/.*(NEEDED).*\[\(.*\)\]/\1/p"' _ {} \; | sort -u)
done

# The built-in corpus (data/ is ignored, and the trainer's default --data and
# bench/peer.py read data/default_corpus.txt): made by scripts/setup.sh.
[ -s data/default_corpus.txt ] || die "expected data/default_corpus.txt (scripts/setup.sh makes it), found none"
cp data/default_corpus.txt "$carry.new/"

rm -rf "$carry" && mv "$carry.new" "$carry"
bytes=$(du -sb "$carry" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_carry: $carry/ holds $(ls "$carry"/*.deb | wc -l) packages and the corpus: $mib MiB (limit $limit_mib of the tool's 64)"
ls "$carry"/*.deb | sed 's|.*/||; s|_.*||' | tr '\n' ' '; echo
[ "$mib" -le "$limit_mib" ] || die "$carry/ is $mib MiB, expected at most $limit_mib: the device tool carries 64 MiB with the tree"
grep -qx '/.gpu-carry/' .gitignore || echo "gpu_carry: note: .gitignore does not ignore /.gpu-carry/; the folder would travel as untracked files" >&2
