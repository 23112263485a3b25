#!/usr/bin/env python3
"""Renders every chat template of a folder (the 70 hub templates that
llama-cpp-python 0.3.36's sdist carries) on a fixed set of conversations
with transformers, and with our C++ renderer (tests/text/chat_template_check),
and compares them byte for byte.

    chat_template_reference.py --checker BUILD/chat_template_check --templates DIR [--only NAME]

A case matches when the texts (and the {% generation %} ranges, where the
template has them) are identical, or when both refuse. A template whose
cases all match renders identically; one where ours refuses a case that
transformers renders is listed as refused, with our message. Exit 1 when
any case renders different text (or renders where transformers raises),
or when fewer templates than MATCH_FLOOR render identically.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# The number of templates that rendered identically when this script was last
# brought up to date; fewer is a regression.
MATCH_FLOOR = 67

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Hello! How are you?"}
ASSISTANT = {"role": "assistant", "content": "I am fine, thank you. How can I help?"}
USER_2 = {"role": "user", "content": "What is 2+2?"}
ASSISTANT_2 = {"role": "assistant", "content": "2+2 is 4."}

# (name, messages, add_generation_prompt)
CONVERSATIONS = [
    ("user only", [USER], True),
    ("system+user", [SYSTEM, USER], True),
    ("system+user+assistant", [SYSTEM, USER, ASSISTANT], False),
    ("system+user+assistant, generation prompt", [SYSTEM, USER, ASSISTANT], True),
    ("multi-turn", [USER, ASSISTANT, USER_2, ASSISTANT_2], False),
    ("system+multi-turn, generation prompt", [SYSTEM, USER, ASSISTANT, USER_2], True),
    ("empty content", [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}], False),
    ("unicode", [{"role": "user", "content": "Grüße, 世界! 🙂\nzweite Zeile"},
                 {"role": "assistant", "content": "Ça va — ✓"}], False),
]


def reference_render(source, messages, add_generation_prompt):
    """transformers' rendering: {"text", "ranges" (byte offsets)} or {"error"}."""
    from transformers.utils.chat_template_utils import render_jinja_template
    has_generation = re.search(r"\{\%-?\s*generation\s*-?\%\}", source) is not None
    try:
        rendered, indices = render_jinja_template(
            conversations=[messages], chat_template=source, add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=has_generation, **SPECIAL_TOKENS)
    except Exception as e:  # transformers refuses: record what it said
        return {"error": f"{type(e).__name__}: {e}"}
    text = rendered[0]
    ranges = []
    if has_generation and indices:
        ranges = [[len(text[:b].encode()), len(text[:e].encode())] for b, e in indices[0]]
    return {"text": text, "ranges": ranges}


def describe_difference(ours, theirs):
    """Where two texts first differ, with a little context on both sides."""
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"first difference at character {at}: ours {ours[max(0, at - 30):at + 40]!r}, "
            f"transformers {theirs[max(0, at - 30):at + 40]!r} (lengths {len(ours)} / {len(theirs)})")


def compare(ours, theirs):
    """(status, detail): status "same", "both refuse", "refused" (ours only) or "DIFFERENT"."""
    if "error" in theirs and "error" in ours:
        return "both refuse", ""
    if "error" in ours:
        return "refused", ours["error"]
    if "error" in theirs:
        return "DIFFERENT", "transformers raised " + theirs["error"] + " but ours rendered"
    if ours["text"] != theirs["text"]:
        return "DIFFERENT", describe_difference(ours["text"], theirs["text"])
    if theirs["ranges"] and ours["ranges"] != theirs["ranges"]:
        return "DIFFERENT", f"generation ranges: ours {ours['ranges']}, transformers {theirs['ranges']}"
    return "same", ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checker", required=True)
    parser.add_argument("--templates", required=True)
    parser.add_argument("--only", default=None, help="one template file name")
    args = parser.parse_args()
    started = time.time()
    names = sorted(n for n in os.listdir(args.templates) if n.endswith(".jinja"))
    if args.only:
        names = [n for n in names if n == args.only]
    cases, reference = [], []
    for name in names:
        path = os.path.join(args.templates, name)
        source = open(path, encoding="utf-8").read()
        for title, messages, generation_prompt in CONVERSATIONS:
            variables = {"messages": messages, "tools": None, "documents": None,
                         "add_generation_prompt": generation_prompt, **SPECIAL_TOKENS}
            cases.append({"template": path, "variables": variables, "name": name, "title": title})
            reference.append(reference_render(source, messages, generation_prompt))
    with tempfile.TemporaryDirectory() as work:
        cases_path, results_path = os.path.join(work, "cases.json"), os.path.join(work, "results.json")
        with open(cases_path, "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False)
        subprocess.run([args.checker, cases_path, results_path], check=True)
        with open(results_path, encoding="utf-8") as f:
            ours = json.load(f)

    identical, refused, different = [], [], []
    for name in names:
        rows = [(c, r, o) for c, r, o in zip(cases, reference, ours) if c["name"] == name]
        outcomes = [(c["title"],) + compare(o, r) for c, r, o in rows]
        bad = [o for o in outcomes if o[1] == "DIFFERENT"]
        mine = [o for o in outcomes if o[1] == "refused"]
        if bad:
            different.append(name)
            for title, _, detail in bad:
                print(f"{name}: DIFFERENT on '{title}': {detail}")
        elif mine:
            refused.append((name, mine[0][2]))
            print(f"{name}: refused on {len(mine)} of {len(outcomes)} conversations: {mine[0][2]}")
        else:
            identical.append(name)
            both = sum(1 for o in outcomes if o[1] == "both refuse")
            print(f"{name}: identical on all {len(outcomes)} conversations" +
                  (f" ({both} refused by both)" if both else ""))
    refused_list = "; ".join(f"{n} ({why})" for n, why in refused) or "none"
    print(f"chat templates: {len(identical)} of {len(names)} render identically on every conversation; "
          f"{len(refused)} refused: {refused_list}")
    print(f"({time.time() - started:.1f} s)")
    if different:
        print(f"FAIL: {len(different)} templates render different text: {', '.join(different)}")
        return 1
    if not args.only and len(identical) < MATCH_FLOOR:
        print(f"FAIL: {len(identical)} templates render identically, fewer than the floor of {MATCH_FLOOR}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
