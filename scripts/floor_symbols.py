#!/usr/bin/env python3
"""The floor plan, held by the linker's view: fails when a floor's object
files need a symbol that only a higher floor defines (a function declared on
a lower floor and defined on a higher one, a vtable whose key function lives
upstairs), so that a lower floor would not link without the floors above it.

    scripts/floor_symbols.py OBJECT_DIR...

Each OBJECT_DIR holds one library's objects as CMake lays them out,
OBJECT_DIR/<folder>/<file>.cpp.o for src/<folder>/<file>.cpp; the floors are
scripts/floors.py's (which holds the same plan for #includes). The build runs
this after it archives libfsdp, and after libfsdp_plan over both libraries'
objects (CMakeLists.txt), so a definition on the wrong floor fails the build,
naming the symbol, who needs it and who defines it: an engine object that
needs the planner's too (the link order alone would not catch it, since the
tools link both).

A symbol counts as defined on a floor when one of its objects defines it
strongly (nm's T, D, B, R): inline functions and template instances, which
every object that uses them may emit (W, V, u), tie no floor to another.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from floors import FLOOR_OF, FLOORS  # noqa: E402

STRONG = set("TDBR")


def symbols(path):
    """(defined strongly, undefined) mangled names of one object file."""
    out = subprocess.run(["nm", "-P", path], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in STRONG:
            defined.add(name)
    return defined, undefined


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    roots = sys.argv[1:]
    objects = []  # (floor level, folder/file, path)
    for root in roots:
        for folder in sorted(os.listdir(root)):
            if folder not in FLOOR_OF:
                continue
            for dirpath, _, files in os.walk(os.path.join(root, folder)):
                for f in sorted(files):
                    if f.endswith(".o"):
                        objects.append((FLOOR_OF[folder], os.path.join(folder, f[:-len(".cpp.o")] + ".cpp"),
                                        os.path.join(dirpath, f)))
    if not objects:
        sys.exit(f"floor_symbols.py: no object files under {' '.join(roots)}")
    lowest_definer = {}  # symbol -> (level, file) of the lowest floor defining it
    needs = []  # (level, file, symbol)
    for level, name, path in objects:
        defined, undefined = symbols(path)
        for s in defined:
            if s not in lowest_definer or level < lowest_definer[s][0]:
                lowest_definer[s] = (level, name)
        needs += [(level, name, s) for s in undefined]
    upward = sorted({(name, s, lowest_definer[s][1]) for level, name, s in needs
                     if s in lowest_definer and lowest_definer[s][0] > level})
    if not upward:
        print(f"floors (symbols): {len(objects)} objects, no floor needs a definition from a floor above it")
        return 0
    shown = demangle([s for _, s, _ in upward])
    print("floors (symbols): a floor needs definitions that only a floor above it has "
          "(move each definition to its declaration's floor):", file=sys.stderr)
    floor_names = {level: "/".join(folders) for level, folders in enumerate(FLOORS)}
    for (user, _, definer), readable in zip(upward, shown):
        print(f"  src/{user} ({floor_names[FLOOR_OF[user.split('/')[0]]]}) needs {readable}, "
              f"defined in src/{definer}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
