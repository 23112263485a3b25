#!/usr/bin/env python3
"""Lists the #includes that run upward between fsdp-cpp's floors, and exits 1
when there is any (the ctest `floors` runs it).

    scripts/floors.py [--all]

The floors, lowest first (docs/how-it-works.md, "The floor plan"): a file may
include its own floor and the ones below, never one above.

    base        file I/O, checksums, fault injection, traces, LibTorch shims,
                devices and streams, the CPU loop: imports nothing of ours
    comm        process groups (MPI, NCCL), collectives, the CUDA module loader
    optim       optimizers and their state over flat shards
    core        the engine: units, flat params, the step, memory, the
                offload seam (core/shard_offload.h)
    offload     the placements behind the seam (memory, host, disk)
    models, state_dict, text
                models and their data, state dicts and checkpoints, tokenizers
    plan        the memory planner (its own library, fsdp_plan): what a run
                needs, from the models' descriptions and fully_shard's options
    tools       (tools/: the programs)

A file in src/FOLDER/ is on FOLDER's floor; a public header include/fsdp/X.h
is on the floor of the folder that implements it (src/*/X.cpp), or of the one
PUBLIC_HEADER_FLOORS names. With --all the script also prints every include
that crosses floors, downward ones included.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOORS = [("base",), ("comm",), ("optim",), ("core",), ("offload",), ("models", "state_dict", "text"), ("plan",), ("tools",)]
FLOOR_OF = {folder: level for level, folders in enumerate(FLOORS) for folder in folders}
# Public headers no .cpp of the same name implements: the folder that owns them.
PUBLIC_HEADER_FLOORS = {
    "error.h": "base",
    "comm.h": "comm",
    "state_dict.h": "state_dict",
    "checkpoint.h": "state_dict",  # checkpoint_{schema,save,load}.cpp
    "fsdp.h": "tools",  # the umbrella header includes everything; only programs include it
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def public_header_folder(name):
    if name in PUBLIC_HEADER_FLOORS:
        return PUBLIC_HEADER_FLOORS[name]
    stem = name[:-2]
    owners = [folder for folder in sorted(os.listdir(os.path.join(ROOT, "src")))
              if os.path.exists(os.path.join(ROOT, "src", folder, stem + ".cpp"))]
    if len(owners) != 1:
        sys.exit(f"floors.py: include/fsdp/{name}: expected one src/*/{stem}.cpp to say its floor, "
                 f"found {owners or 'none'}; name its folder in PUBLIC_HEADER_FLOORS")
    return owners[0]


def folder_of_include(target):
    """The folder an #include "target" names, or None for one outside the project's."""
    parts = target.split("/")
    if parts[0] == "fsdp" and len(parts) == 2:
        return public_header_folder(parts[1])
    if parts[0] in FLOOR_OF and len(parts) == 2 and os.path.exists(os.path.join(ROOT, "src", target)):
        return parts[0]
    return None


def files():
    """(path relative to the root, its folder) of every source and header."""
    for top in ("src", "include/fsdp", "tools"):
        for here, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if not name.endswith((".h", ".cpp", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(here, name), ROOT)
                parts = path.split(os.sep)
                if parts[0] == "src":
                    folder = parts[1]
                elif parts[0] == "include":
                    folder = public_header_folder(name)
                else:
                    folder = "tools"
                yield path, folder


def main():
    show_all = "--all" in sys.argv[1:]
    upward = []
    for path, folder in files():
        if folder not in FLOOR_OF:
            sys.exit(f"floors.py: {path}: the folder '{folder}' is on no floor; add it to FLOORS")
        with open(os.path.join(ROOT, path), encoding="utf-8") as source:
            text = source.read()
        for target in INCLUDE.findall(text):
            to = folder_of_include(target)
            if to is None or to == folder:
                continue
            up = FLOOR_OF[to] > FLOOR_OF[folder]
            if up:
                upward.append((path, folder, target, to))
            if show_all and FLOOR_OF[to] != FLOOR_OF[folder]:
                print(f"{'UP  ' if up else 'down'} {folder} -> {to}: {path} includes {target}")
    for path, folder, target, to in upward:
        print(f"{path}: includes {target}, on the {to} floor, above {folder}'s")
    print(f"floors.py: {len(upward)} upward include(s)")
    return 1 if upward else 0


if __name__ == "__main__":
    sys.exit(main())
