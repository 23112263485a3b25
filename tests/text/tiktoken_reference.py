#!/usr/bin/env python3
"""fsdp-data's tokenizer on REAL vocabularies: GPT-2's 50,257 tokens and
whisper's multilingual one, from the *.tiktoken files of PyPI's
openai-whisper sdist (scripts/python_refs.sh puts them in .venv/assets/).

Builds each tokenizer.json as Hugging Face's GPT-2 one is made: vocab = the
tiktoken ranks, each token's bytes through GPT-2's bytes_to_unicode; merges
recovered by BPE-ing each token's bytes with the ranks below its own (as
tiktoken's conversion does: exactly two parts each); the ByteLevel
pre-tokenizer (GPT-2's regex); `<|endoftext|>` = the first id after the ranks
(50256 for GPT-2). Then checks
  - the `tokenizers` package gives GPT-2's known ids on a few strings
    (tiktoken's own tests: "hello world" -> [31373, 995], ...),
  - fsdp-data gives the same ids on those strings,
  - on each text file, and on a random text (fixed seed: pieces that stress
    GPT-2's regex, characters assigned in Unicode 3.2, invalid UTF-8 bytes),
    fsdp-data's ids (whole and streamed) equal tokenizers' and decode back to
    the text (tokenizer_reference.compare).
Letters added in Unicode 15.0 and later are left out: the system's Oniguruma
(Debian's 6.9.8) classifies them with Unicode 14 tables, tokenizers' own copy
with newer ones, so a pre-token boundary can differ there (docs/data.md).
Exits 77 (skip) without tokenizers or the assets, unless CI is set.

  tiktoken_reference.py FSDP_DATA WORKDIR ASSET_DIR TEXT_FILE...
"""
import base64
import json
import os
import random
import sys
import unicodedata

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
except ImportError as e:
    print(f"skipped: this python ({sys.executable}) has no tokenizers package ({e})")
    sys.exit(1 if os.environ.get("CI") else 77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_reference import compare, our_ids  # noqa: E402

# GPT-2's ids (tiktoken's tests and GPT-2's encoder.json), encode(text, add_special_tokens=False).
GPT2_KNOWN = {
    "hello world": [31373, 995],
    "Hello world": [15496, 995],
    " the": [262],
    "!": [0],
    "\n": [198],
    "<|endoftext|>": [50256],
    "hello <|endoftext|>": [31373, 220, 50256],
}


RANDOM_PIECES = ["'s", "'S", "'ll", "'re", "'ve", "'d", "'m", "'t", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n",
                 "\u00a0", "\u3000", "\u2028", "\u200b", "\ufeff", "\x00", "\x7f", "hello", " world", " The", "don't",
                 "DON'T", "123", "4567", "\u0661\u0662", "\u4e2d\u6587", "e\u0301", "\U0001f600", "\U0001f469\u200d\U0001f467",
                 "\U0001f1eb\U0001f1f7", "\u2014", "!!", "?", ".", "<|endoftext|>", "<|endoftext", "\u20ac", "\ufb01", "\u0130",
                 "\u01c5", "\u0915\u094d\u0937", "\U0001d400", "\ue000"]


def random_hostile_text(path, seed, pieces=40000):
    """RANDOM_PIECES and random characters assigned by Unicode 3.2, with a few invalid UTF-8 bytes."""
    rng = random.Random(seed)
    out = []
    while len(out) < pieces:
        if rng.random() < 0.85:
            out.append(rng.choice(RANDOM_PIECES))
            continue
        c = chr(rng.choice([rng.randrange(0x20, 0x7f), rng.randrange(0xa0, 0x3000), rng.randrange(0x10000, 0x1fbff)]))
        if unicodedata.ucd_3_2_0.category(c) not in ("Cn", "Cs"):
            out.append(c)
    data = bytearray("".join(out).encode("utf-8"))
    for _ in range(len(data) // 2000):
        data.insert(rng.randrange(len(data)), rng.choice([0x80, 0xc3, 0xe2, 0xf0, 0xff]))
    open(path, "wb").write(bytes(data))
    return path


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_tiktoken(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bpe_below(ranks, token, max_rank):
    """token's bytes merged greedily by rank, using only ranks below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def tokenizer_from_tiktoken(tiktoken_path, out_path):
    ranks = load_tiktoken(tiktoken_path)
    assert sorted(ranks.values()) == list(range(len(ranks))), f"{tiktoken_path}: ranks are not 0..{len(ranks) - 1}"
    byte_char = bytes_to_unicode()
    to_str = lambda b: "".join(byte_char[x] for x in b)  # noqa: E731
    vocab = {to_str(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = bpe_below(ranks, token, rank)
        assert len(parts) == 2, f"{tiktoken_path}: token {token!r} (rank {rank}) is not one merge of lower ranks: {parts}"
        merges.append((to_str(parts[0]), to_str(parts[1])))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    assert tok.token_to_id("<|endoftext|>") == len(ranks)
    tok.save(out_path)
    print(f"{os.path.basename(tiktoken_path)}: {len(ranks) + 1} tokens, {len(merges)} merges -> {out_path}")
    return out_path


def check_known_ids(fsdp_data, workdir, path):
    reference = Tokenizer.from_file(path)
    failures = []
    for i, (text, ids) in enumerate(GPT2_KNOWN.items()):
        got = reference.encode(text, add_special_tokens=False).ids
        if got != ids:
            failures.append(f"tokenizers on {text!r}: {got}, GPT-2's ids are {ids}")
        text_file = os.path.join(workdir, f"known-{i}.txt")
        open(text_file, "w", encoding="utf-8", newline="").write(text)
        ours = our_ids(fsdp_data, path, text_file)
        if ours != ids:
            failures.append(f"fsdp-data on {text!r}: {ours}, GPT-2's ids are {ids}")
    print(f"GPT-2's known ids on {len(GPT2_KNOWN)} strings: {'OK' if not failures else 'FAILED'}")
    return failures


def main():
    fsdp_data, workdir, assets, texts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    tiktokens = {name: os.path.join(assets, f"{name}.tiktoken") for name in ("gpt2", "multilingual")}
    missing = [p for p in tiktokens.values() if not os.path.isfile(p)]
    if missing:
        print(f"skipped: no {', '.join(missing)} (scripts/python_refs.sh downloads them)")
        return 1 if os.environ.get("CI") else 77
    os.makedirs(workdir, exist_ok=True)
    texts = texts + [random_hostile_text(os.path.join(workdir, "random-hostile.txt"), seed=1)]
    failures = []
    for name, tiktoken_path in tiktokens.items():
        path = tokenizer_from_tiktoken(tiktoken_path, os.path.join(workdir, f"{name}-real.json"))
        if name == "gpt2":
            failures += check_known_ids(fsdp_data, workdir, path)
        for text_file in texts:
            failures += compare(fsdp_data, workdir, f"{name} (real vocabulary)", path, text_file)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
