#!/usr/bin/env python3
"""Counts the names a user of the installed headers can reach, and exits 1
when there are more than --max (the ctest `public_names` runs it).

    scripts/public_names.py [--max N] [--list] [--ctags PATH] [INCLUDE_DIR]

A name is what universal-ctags tags at namespace scope in include/fsdp/
(prototypes, functions, classes, structs, enums, typedefs, variables,
aliases), outside any `detail` namespace: members are not counted, and each
overload counts once per declaration, as issue 58 counted them. Names the
library, its tools or its tests use alone belong in a header beside their
source in src/ (docs/how-it-works.md says why), so the count only grows with
something a training program calls. --list prints every name by header.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {"prototype", "function", "class", "struct", "enum", "typedef", "variable", "alias"}


def public_names(include_dir, ctags):
    """(header, name, kind) of every public name under include_dir."""
    try:
        out = subprocess.run([ctags, "--output-format=json", "--languages=C++", "--kinds-C++=+p", "--fields=+KsZ",
                              "-R", "-f", "-", include_dir], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"public_names.py: universal-ctags failed ({e}); Debian: apt-get install universal-ctags")
    names = []
    for line in out.splitlines():
        tag = json.loads(line)
        if tag.get("_type") != "tag" or tag.get("kind") not in KINDS:
            continue
        if tag.get("scopeKind", "") not in ("", "namespace") or "detail" in tag.get("scope", "").split("::"):
            continue
        names.append((os.path.relpath(tag["path"], include_dir), tag["name"], tag["kind"]))
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=None, help="fail above this many names")
    parser.add_argument("--list", action="store_true", help="print every name by header")
    parser.add_argument("--ctags", default="ctags", help="the universal-ctags program (default: ctags)")
    parser.add_argument("include_dir", nargs="?", default=os.path.join(ROOT, "include", "fsdp"))
    args = parser.parse_args()
    names = public_names(args.include_dir, args.ctags)
    per_header = collections.Counter(header for header, _, _ in names)
    if args.list:
        for header, count in per_header.most_common():
            print(f"{count:4d} {header}: " + " ".join(n for h, n, _ in names if h == header))
    print(f"{len(names)} public names in {len(per_header)} headers"
          + (f" (at most {args.max})" if args.max is not None else ""))
    if args.max is not None and len(names) > args.max:
        print(f"public_names.py: {len(names)} names where {args.max} are allowed: move what only the library, its "
              "tools or its tests use to a header beside its source in src/ (--list shows them by header)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
