# fsdp-cpp as an installed C++ library: `cmake --install` into a fresh
# prefix gives the public headers (and no private ones), libfsdp, the tools
# and the CMake package; a project outside the tree (examples/consumer) finds
# it with find_package(fsdp_cpp), builds the Llama example against
# fsdp::fsdp (one translation unit), and the result trains at W=2 exactly as
# the in-tree build does.
src="$(cd "$here/../.." && pwd)"
prefix="$work/prefix"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# The layout.
for f in bin/fsdp-train bin/fsdp-ckpt bin/fsdp-plan bin/fsdp-run bin/fsdp-plot; do
  [ -x "$prefix/$f" ] || fail "$f is not installed (or not executable)"
done
ls "$prefix"/lib*/libfsdp.* >/dev/null 2>&1 || fail "libfsdp is not installed"
ls "$prefix"/lib*/libfsdp_plan.* >/dev/null 2>&1 || fail "libfsdp_plan (the planner) is not installed"
# The CUDA configuration's module, beside libfsdp (src/comm/cuda_module.cpp
# looks there from the installed tools), finding its libraries from there.
if [ "$(cache FSDP_CUDA)" = ON ]; then
  module=$(ls "$prefix"/lib*/libfsdp_cuda.so 2>/dev/null | head -1)
  [ -n "$module" ] || fail "the CUDA module libfsdp_cuda.so is not installed beside libfsdp"
  ! ldd "$module" | grep 'not found' > /dev/null || fail "the installed module misses libraries: $(ldd "$module" | grep 'not found')"
fi
cmake_dir=$(dirname "$(ls "$prefix"/lib*/cmake/fsdp_cpp/fsdp_cppConfig.cmake 2>/dev/null | head -1)")
for f in fsdp_cppConfig.cmake fsdp_cppConfigVersion.cmake fsdp_cppTargets.cmake; do
  [ -f "$cmake_dir/$f" ] || fail "the package lacks $f"
done
# Exactly the public headers: include/fsdp/*.h, nothing from src/.
diff <(cd "$src/include" && find . -type f | sort) <(cd "$prefix/include" && find . -type f | sort) ||
  fail "installed headers differ from include/fsdp"
# The umbrella header is the whole API a user needs: the examples include
# fsdp/fsdp.h and no other header of ours (the consumer below builds one).
for example in "$src"/examples/*.cpp; do
  other=$(grep -o '#include [<"]fsdp/[^">]*' "$example" | grep -v 'fsdp/fsdp\.h$' || true)
  [ -z "$other" ] || fail "$(basename "$example") includes $other: the examples include fsdp/fsdp.h alone"
done
grep -q '#include "fsdp/fsdp.h"' "$prefix/include/fsdp/fsdp.h" && fail "fsdp/fsdp.h includes itself"
[ -f "$prefix/include/fsdp/fsdp.h" ] || fail "the umbrella header fsdp/fsdp.h is not installed"
# Every installed header is reachable from the umbrella: none is installed
# that it leaves out, but the planner's (fsdp::fsdp_plan, a library of its
# own), which it names instead.
planner_headers="memory_plan.h run_plan.h"
for h in "$prefix"/include/fsdp/*.h; do
  n=$(basename "$h"); [ "$n" = fsdp.h ] && continue
  if [[ " $planner_headers " == *" $n "* ]]; then
    ! grep -q "#include \"fsdp/$n\"" "$prefix/include/fsdp/fsdp.h" || fail "fsdp/fsdp.h includes the planner's fsdp/$n"
    grep -q "fsdp/$n" "$prefix/include/fsdp/fsdp.h" || fail "fsdp/fsdp.h does not name the planner's fsdp/$n"
    continue
  fi
  grep -q "#include \"fsdp/$n\"" "$prefix/include/fsdp/fsdp.h" || fail "fsdp/fsdp.h does not include the installed fsdp/$n"
done
grep -q "fsdp::fsdp_plan" "$cmake_dir/fsdp_cppTargets.cmake" || fail "the package exports no fsdp::fsdp_plan"
# The exported target carries no build-tree property: no source paths, no
# precompiled header, no default-corpus definition.
targets=$(cat "$cmake_dir"/fsdp_cppTargets*.cmake)
for bad in "$src" PRECOMPILE_HEADERS FSDP_DEFAULT_CORPUS; do
  ! grep -qF -- "$bad" <<<"$targets" || fail "the exported target mentions '$bad'"
done
# Nor this machine's library files: LibTorch's are added by the config, from
# the LibTorch the consumer finds.
! grep -q 'INTERFACE_LINK_LIBRARIES "[^"]*/' <<<"$targets" || fail "the exported target links files by path"

# A consumer project, built against the same LibTorch and compiler.
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DTorch_DIR="$(cache Torch_DIR)" -DCMAKE_CXX_COMPILER="$(cache CMAKE_CXX_COMPILER)" > "$work/consumer.log" 2>&1 ||
  { cat "$work/consumer.log" >&2; fail "configuring the consumer project failed"; }
grep -q "^fsdp_cpp_DIR:PATH=$cmake_dir\$" "$work/consumer/CMakeCache.txt" || fail "the consumer did not find the installed package"
cmake --build "$work/consumer" -j2 >> "$work/consumer.log" 2>&1 || { tail -40 "$work/consumer.log" >&2; fail "building the consumer failed"; }

# It trains at W=2, with the same losses as the in-tree example.
steps=6
args=(--steps "$steps" --batch 2 --data "$src/data/default_corpus.txt")
"$prefix/bin/fsdp-run" -n 2 -- "$work/consumer/llama" "${args[@]}" --log "$work/consumer.jsonl" > "$work/consumer.out" 2>&1 ||
  { cat "$work/consumer.out" >&2; fail "the consumer's llama failed at W=2"; }
"$run" -n 2 -- "$build/example-llama" "${args[@]}" --log "$work/in_tree.jsonl" > "$work/in_tree.out" 2>&1 ||
  { cat "$work/in_tree.out" >&2; fail "the in-tree example-llama failed"; }
jq -se 'all(.[]; (.loss | type) == "number")' "$work/consumer.jsonl" >/dev/null || fail "the consumer's log holds non-numeric losses"
compare_losses "$work/consumer.jsonl" "$work/in_tree.jsonl" 1e-6 "$steps"
first=$(losses "$work/consumer.jsonl" | head -1); last=$(losses "$work/consumer.jsonl" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "the consumer's loss did not go down: $first -> $last"
echo "consumer llama at W=2: loss $first -> $last"

# The installed tools run from the prefix (fsdp-run finds nothing in the build tree).
"$prefix/bin/fsdp-run" -n 2 -- "$prefix/bin/fsdp-train" --preset tiny --steps 2 --log "$work/train.jsonl" > "$work/train.out" 2>&1 ||
  { cat "$work/train.out" >&2; fail "the installed fsdp-train failed"; }
require_steps "$work/train.jsonl" 2
