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
or when fewer templates than MATCH_FLOOR render identically. A set of small
snippets (SNIPPETS) checks Jinja's semantics beyond what the templates reach.
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


# Jinja semantics beyond what the hub templates touch on these conversations,
# one small template each, rendered with SNIPPET_VARIABLES: ours against
# transformers' environment (a snippet both refuse matches).
SNIPPET_VARIABLES = {"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"}]}
SNIPPETS = [
    '{{ "  a b  "|trim }}|{{ "xxaxx".strip("x") }}|{{ "a,b,,c".split(",") }}|{{ " a  b ".split() }}|{{ "a b c".split(" ", 1) }}',
    '{{ "abc".startswith(("x","a")) }}{{ "aXa".replace("a","b") }}{{ "hello world".title() }}{{ "hELLO".capitalize() }}'
    '{{ "abcb".find("b") }}{{ "abcb".count("b") }}{{ "{}-{}".format(1, "x") }}{{ "  a b ".rsplit(None, 1) }}',
    '{% set d = {"b": 1, "a": [1, 2.5, none, true]} %}{{ d }}{{ d.items() }}{{ d.keys()|list }}{{ d.get("z") }}'
    '{{ d.get("z", 3) }}{{ d|tojson }}{{ d|tojson(indent=2) }}{{ d|dictsort }}{{ d|items|list }}',
    '{{ "hello"[1:3] }}{{ "hello"[-1] }}{{ [1,2,3,4][::-1] }}{{ [1,2,3,4][-2:] }}{{ [1,2,3][5] }}{{ "abcdef"[-3:-1] }}',
    '{{ "%s=%d %.2f %r %+d %5.1f|%-4s|" % ("a", 3, 2.5, "q", 5, 3.14159, "ab") }}{{ "x" ~ 1 ~ none }}{{ "%s" % {"a": 1} }}',
    '{{ none is none }}{{ 1 is number }}{{ {} is mapping }}{{ [] is sequence }}{{ x is undefined }}{{ 3 is odd }}'
    '{{ 9 is divisibleby 3 }}{{ 1 is equalto(1) }}{{ 0 is false }}{{ "a" is in ["a"] }}{{ 5 is gt 3 }}{{ "a"|lower is lower }}',
    '{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}'
    '{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle("a","b") }};{% endfor %}',
    '{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}{% else %}none{% endfor %}{% for x in [] %}{% else %}e{% endfor %}'
    '{% for k, v in {"a": 1}.items() %}{{ k }}={{ v }}{% endfor %}{% for i in range(9) %}{% if i == 2 %}{% continue %}'
    '{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}',
    '{% set top = "T" %}{% macro f(a, b=a ~ "!", c=top) %}{{ a }}{{ b }}{{ c }}{{ d }}{% endmacro %}'
    '{% for x in [7] %}{{ f(x) }}{% endfor %}{% set d = "D" %}{{ f(1, c=2) }}',
    '{% set x = 0 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}{{ x }}{% set x = i %}{% set ns.n = ns.n + i %}'
    '{% endfor %}{{ x }}{{ ns.n }}{% set b %}block {{ 1 + 1 }}{% endset %}{{ b }}{% filter upper %}f{% endfilter %}',
    '{% if false %}a{% elif none %}b{% else %}c{% endif %}{{ "y" if 1 else "n" }}{{ "y" if 0 }}|{{ 7 // 2 }}{{ -7 // 2 }}'
    '{{ -7 % 3 }}{{ 2 ** 3 }}{{ 7 / 2 }}{{ 1.5 * 2 }}{{ -0.0 }}{{ 1e20 }}{{ 1e-7 }}{{ 0.1 + 0.2 }}{{ true + 1 }}',
    'a\n  {% if true %}\n  b\n  {% endif %}\n  {#- c #}\nc  {%- if true -%}  d  {%- endif -%}  e\n{%+ if true %}f{% endif %}'
    '{% raw %}{{ g }}{% endraw %}\n  {{ "h" }}  \n\n',
    '{{ [1,2,3]|join(",") }}{{ messages|map(attribute="role")|list }}{{ ["a","b"]|map("upper")|join }}'
    '{{ [1,2,3,4]|select("odd")|list }}{{ messages|selectattr("role","equalto","user")|list }}'
    '{{ messages|rejectattr("role","eq","user")|map(attribute="content")|first }}{{ none|select|list }}',
    '{{ x|default("d") }}{{ ""|d("e", true) }}{{ "a-b c"|title }}{{ "aab"|replace("a","c",1) }}{{ "a\nb"|indent(2) }}'
    '{{ "a\n\nb"|indent(2, true, true) }}{{ 1|string }}{{ "3"|int + 1 }}{{ "2.5"|float }}{{ "x"|int }}',
    '{{ [3,1,2]|sort }}{{ ["b","A","a"]|unique|list }}{{ [1,-2]|map("abs")|list }}{{ 2.567|round(2) }}{{ 2.5|round }}'
    '{{ [1,2,3]|sum }}{{ [1,2,3]|max }}{{ "abc"|reverse }}{{ "a b c"|wordcount }}{{ [1,2,3,4,5]|batch(2)|list }}',
    '{{ "hello world foo bar"|truncate(9) }}{{ "<a>"|escape }}{{ "x"|safe + "<" }}{{ [1,2]|length }}{{ "abc"|list }}'
    '{{ (1,) }}{{ ["it\'s", \'say "x"\'] }}{{ {"a": (1, 2)} }}{{ "é\\"\\n🙂"|tojson }}{{ {"b":1,"a":2}|tojson(sort_keys=true) }}',
    '{{ messages|selectattr("role", "eq", "system")|list|length }}{% if messages|selectattr("role", "eq", "system") %}'
    'always{% endif %}{{ messages[0].content.split()[0] }}{{ (messages|first).role|upper }}{{ messages[-1].content[:1] }}',
    '{{ "ß"|upper }}{{ "Grüße"|length }}{{ "世界"[0] }}{{ "ÀÉ"|lower }}{{ "ﬁx"|upper }}{{ "🙂"|tojson(ensure_ascii=true) }}',
    '{% set x = 1 %}{% filter upper %}{% set x = 2 %}{{ x }}{% endfilter %}{% set b %}{% set x = 3 %}{% endset %}{{ x }}'
    '{% generation %}{% set x = 4 %}{% endgeneration %}{{ x }}{% for i in [5] %}{% set x = 6 %}{% macro m() %}{{ x }}'
    '{{ i }}{{ loop.index }}{{ m is defined }}{% endmacro %}{% set x = 7 %}{{ m() }}{% endfor %}{{ x }}',
    '{{ raise_exception("boom") }}',
    '{% set l = [] %}{{ l.append(1) }}',
    '{{ undefined_thing.attribute }}',
    '{{ [1, "a"]|sort }}',
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


def check_snippets(checker, work):
    """Each of SNIPPETS, ours against transformers' environment: the names of those that differ."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    cases, reference = [], []
    for i, snippet in enumerate(SNIPPETS):
        path = os.path.join(work, f"snippet{i}.jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(snippet)
        cases.append({"template": path, "variables": SNIPPET_VARIABLES})
        try:
            reference.append({"text": _compile_jinja_template(snippet).render(**SNIPPET_VARIABLES), "ranges": []})
        except Exception as e:
            reference.append({"error": f"{type(e).__name__}: {e}"})
    different = []
    for i, (theirs, ours) in enumerate(zip(reference, run_checker(checker, cases, work))):
        status, detail = compare(ours, theirs)
        if status != "same" and status != "both refuse":
            different.append(f"snippet {i}")
            print(f"jinja snippet {i} {SNIPPETS[i][:60]!r}...: {status}: {detail}")
    print(f"jinja semantics: {len(SNIPPETS) - len(different)} of {len(SNIPPETS)} snippets identical or refused by both")
    return different


def run_checker(checker, cases, work):
    """Our results for `cases` (chat_template_check in, out)."""
    cases_path, results_path = os.path.join(work, "cases.json"), os.path.join(work, "results.json")
    with open(cases_path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    subprocess.run([checker, cases_path, results_path], check=True)
    with open(results_path, encoding="utf-8") as f:
        return json.load(f)


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
        ours = run_checker(args.checker, cases, work)
        different_snippets = [] if args.only else check_snippets(args.checker, work)

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
    if different or different_snippets:
        print(f"FAIL: {len(different + different_snippets)} render different text: "
              f"{', '.join(different + different_snippets)}")
        return 1
    if not args.only and len(identical) < MATCH_FLOOR:
        print(f"FAIL: {len(identical)} templates render identically, fewer than the floor of {MATCH_FLOOR}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
