#!/usr/bin/env python3
"""Lists the C++ functions of the given files or folders by their length in
lines (signature to closing brace), longest first.

    scripts/function_lengths.py src tools [--max 80] [--top 20]

A function is a brace block at namespace or class scope whose head ends
with a parameter list (and qualifiers or a constructor's initializer list);
lambdas and blocks inside a function count as part of it. Comments, strings
and preprocessor lines are skipped first, so braces in them do not count.
With --max N the script exits 1 when any function is longer than N lines.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cpp", ".cc", ".h", ".hpp", ".cu")
NOT_A_FUNCTION = re.compile(r"^\s*(namespace|class|struct|union|enum|extern)\b|=\s*$|\b(if|for|while|switch|catch)\s*\(")
FUNCTION_HEAD = re.compile(r"\)\s*(const|noexcept(\([^)]*\))?|override|final|mutable|volatile|&|&&|\s)*"
                           r"(->[^{;]*)?(:[^{;]*)?$", re.S)


def strip(text):
    """The text with comments, string and character literals and
    preprocessor lines blanked out (newlines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
            continue
        if c == "R" and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append('""' + "\n" * text.count("\n", i, end))
                i = end
                continue
        if c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum())):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # per open brace: "scope" (namespace/class) or "function"
    head_start = 0
    function_start = None
    for i, c in enumerate(text):
        if c == "{":
            if stack and stack[-1] != "scope":
                stack.append("block")
                continue
            head = text[head_start:i]
            if FUNCTION_HEAD.search(head.rstrip()) and not NOT_A_FUNCTION.search(head.strip()):
                stack.append("function")
                first = head_start + len(head) - len(head.lstrip())
                function_start = (first, " ".join(head.split())[:120])
            else:
                stack.append("scope")
            head_start = i + 1
        elif c == "}":
            kind = stack.pop() if stack else "scope"
            if kind == "function" and function_start:
                begin = text.count("\n", 0, function_start[0]) + 1
                end = text.count("\n", 0, i) + 1
                found.append((end - begin + 1, path, begin, function_start[1]))
                function_start = None
            if not stack or stack[-1] == "scope":
                head_start = i + 1
        elif c == ";" and (not stack or stack[-1] == "scope"):
            head_start = i + 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--max", type=int, default=0, help="exit 1 if any function is longer than this")
    parser.add_argument("--top", type=int, default=15, help="how many to list (0: all)")
    args = parser.parse_args()
    files = []
    for p in args.paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(SOURCE_SUFFIXES)]
        else:
            files.append(p)
    found = sorted((f for path in sorted(files) for f in functions(path)), reverse=True)
    for lines, path, line, head in found[: args.top or None]:
        print(f"{lines:5d}  {path}:{line}  {head}")
    too_long = [f for f in found if args.max and f[0] > args.max]
    if too_long:
        print(f"{len(too_long)} function(s) longer than {args.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
