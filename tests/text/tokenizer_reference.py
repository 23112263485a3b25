#!/usr/bin/env python3
"""fsdp-data's tokenizer against the `tokenizers` package (PyPI).

Builds reference tokenizer.json files locally with tokenizers' BpeTrainer
(GPT-2 style: ByteLevel pre-tokenizer; Llama 3 style: Split(Llama 3's regex)
then ByteLevel(use_regex=False), ignore_merges), SentencePiece-style ones
from a BPE model the `sentencepiece` package trains (byte_fallback) as
transformers converts it (Llama 2's form: normalizer Prepend + Replace;
transformers 5's LlamaTokenizerFast: Metaspace; Metaspace with split and its
decoder), trains one with `fsdp-data train-tokenizer`, and checks on each
text file that
  - fsdp-data's ids equal tokenizers' encode(text, add_special_tokens=False).ids
    (the file read as UTF-8 with errors='replace', as fsdp-data reads it),
  - the streaming encoder (small chunks, several threads) writes the same ids,
  - decoding the ids gives the text back (its UTF-8 bytes; for the
    SentencePiece-style files, what tokenizers' decode gives),
  - `encode --add-special-tokens` puts the post-processor's ids around each
    file as encode(text, add_special_tokens=True) does,
  - tokenizers loads the file our trainer wrote,
  - added tokens that overlap the vocabulary (their content in it under
    another id, an id the vocab gives another token, listed out of id
    order) take the ids tokenizers gives them, decode as its decode does,
    and a file id not kept is warned of (overlap_variants).
Exits 77 (skip) without tokenizers, unless CI is set; skips the
SentencePiece-style files (a note, not a failure) without sentencepiece or
transformers, unless CI is set.

  tokenizer_reference.py FSDP_DATA WORKDIR TEXT_FILE...
"""
import json
import os
import struct
import unicodedata
import subprocess
import sys

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: this python ({sys.executable}) has no tokenizers package ({e})")
    sys.exit(1 if os.environ.get("CI") else 77)

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def reference_tokenizers(workdir, texts):
    """tokenizer.json files made by tokenizers' own BpeTrainer."""
    made = {}
    styles = {
        "gpt2": (pre_tokenizers.ByteLevel(add_prefix_space=False), False),
        "gpt2-prefix-space": (pre_tokenizers.ByteLevel(add_prefix_space=True), False),
        "llama3": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True),
        "qwen2-nfc": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), False),
    }
    for name, (pre, ignore_merges) in styles.items():
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre
        if name.endswith("-nfc"):
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>"] if not name.startswith("llama3") else ["<|begin_of_text|>", "<|endoftext|>", "<|eot_id|>"]
        trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator([open(t, "rb").read().decode("utf-8", errors="replace") for t in texts], trainer)
        path = os.path.join(workdir, f"{name}.json")
        tok.save(path)
        made[name] = path
    return made


def sentencepiece_tokenizers(workdir, corpus, vocab_size=1000):
    """SentencePiece-style tokenizer.json files (bench/tokenizer.sh uses them
    too): a BPE model trained by the `sentencepiece` package (byte_fallback,
    vocab_size pieces, one thread: the same model each run), written by
    transformers' LlamaTokenizerFast from its pieces and the merges
    transformers' own generate_merges ranks by piece score, as its
    SentencePieceExtractor does (LlamaTokenizerFast(vocab_file=...) would
    read the .model through the protobuf package, which the venv lacks)."""
    try:
        import sentencepiece
        from tokenizers import normalizers as hf_normalizers
        from transformers import LlamaTokenizerFast
        from transformers.tokenization_utils_base import generate_merges
    except ImportError as e:
        print(f"SentencePiece-style files skipped: this python ({sys.executable}) lacks {e.name} "
              f"(scripts/python_refs.sh installs it)")
        if os.environ.get("CI"):
            sys.exit(1)
        return {}
    prefix = os.path.join(workdir, "spm")
    sentencepiece.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
        character_coverage=0.9995, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_file=prefix + ".model")
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = generate_merges(vocab, {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())})
    made = {}

    def save(name, tokenizer, edit=None):
        folder = os.path.join(workdir, name)
        tokenizer.save_pretrained(folder)
        path = os.path.join(folder, "tokenizer.json")
        if edit:
            backend = Tokenizer.from_file(path)
            edit(backend)
            backend.save(path)
        made[name] = path

    def llama2_form(backend):  # transformers' LlamaConverter (legacy), as Llama 2's hub file
        backend.normalizer = hf_normalizers.Sequence([hf_normalizers.Prepend("▁"), hf_normalizers.Replace(" ", "▁")])
        backend.pre_tokenizer = None
        backend.model.unk_token = "<unk>"
        backend.add_tokens([AddedToken("new token", normalized=True)])  # matched as "▁new▁token", as Prepend spells it

    def metaspace_split(backend):  # the Metaspace decoder; Metaspace split, prepended always; added tokens
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        backend.add_special_tokens([  # stripping whitespace as Phi-3's <|assistant|> and <|end|> do
            AddedToken("<|assistant|>", rstrip=True, normalized=False, special=True),
            AddedToken("<|end|>", lstrip=True, rstrip=True, normalized=False, special=True),
            AddedToken("<|word|>", single_word=True, normalized=False, special=True)])
        backend.add_tokens([AddedToken("new token", normalized=True)])  # no normalizer here: matched as it is

    save("spm-llama2", LlamaTokenizerFast(vocab=vocab, merges=merges, legacy=True, add_bos_token=True), llama2_form)
    save("spm-metaspace-first",
         LlamaTokenizerFast(vocab=vocab, merges=merges, legacy=False, add_bos_token=True, add_eos_token=True))
    save("spm-metaspace-split", LlamaTokenizerFast(vocab=vocab, merges=merges, legacy=True), metaspace_split)
    return made


def our_ids(fsdp_data, tokenizer, text_file, *flags):
    out = subprocess.run([fsdp_data, "encode", "--tokenizer", tokenizer, "--print-ids", "-q", *flags, text_file],
                         check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def streamed_ids(fsdp_data, tokenizer, text_file, out_file):
    subprocess.run([fsdp_data, "encode", "--tokenizer", tokenizer, "-o", out_file, "--threads", "3",
                    "--chunk-bytes", "512", "-q", text_file], check=True)
    data = open(out_file, "rb").read()
    return list(struct.unpack(f"<{len(data) // 2}H", data))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


REFERENCE_ENCODINGS = {}  # (tokenizer, text file): tokenizers' encoding, computed once


def reference_encoding(reference, tokenizer_path, text_file):
    key = (tokenizer_path, text_file)
    if key not in REFERENCE_ENCODINGS:
        text = open(text_file, "rb").read().decode("utf-8", errors="replace")
        REFERENCE_ENCODINGS[key] = reference.encode(text, add_special_tokens=False)
    return REFERENCE_ENCODINGS[key]


def compare(fsdp_data, workdir, name, tokenizer_path, text_file):
    text = open(text_file, "rb").read().decode("utf-8", errors="replace")
    reference = Tokenizer.from_file(tokenizer_path)
    expected = reference_encoding(reference, tokenizer_path, text_file).ids
    ours = our_ids(fsdp_data, tokenizer_path, text_file)
    label = f"{name} on {os.path.basename(text_file)}"
    failures = []
    if ours != expected:
        i = first_difference(ours, expected)
        failures.append(f"{label}: ids differ at {i} of {len(expected)}: ours {ours[max(0, i - 3):i + 5]}, "
                        f"tokenizers {expected[max(0, i - 3):i + 5]} (text near: "
                        f"{reference.decode(expected[max(0, i - 3):i + 5])!r})")
    streamed = streamed_ids(fsdp_data, tokenizer_path, text_file, os.path.join(workdir, "streamed.bin"))
    if streamed != expected:
        failures.append(f"{label}: the streamed (chunked, 3 threads) ids differ at {first_difference(streamed, expected)}")
    if "prefix-space" in name:  # a space before the text: no round trip (docs/data.md)
        print(f"{label}: {len(expected)} tokens, {'OK' if not failures else 'FAILED'}")
        return failures
    decoded = subprocess.run([fsdp_data, "decode", "--tokenizer", tokenizer_path, os.path.join(workdir, "streamed.bin")],
                             check=True, capture_output=True).stdout
    if name.endswith("-nfc"):  # decoding gives the normalized text
        text = unicodedata.normalize("NFC", text)
    if name.startswith("spm-"):  # what tokenizers' decode gives (Metaspace drops a leading space)
        text = reference.decode(expected, skip_special_tokens=False)
    if decoded != text.encode("utf-8"):
        failures.append(f"{label}: decode(encode(text)) != text (first byte differing: "
                        f"{first_difference(decoded, text.encode('utf-8'))})")
    print(f"{label}: {len(expected)} tokens, {'OK' if not failures else 'FAILED'}")
    return failures


# Where a SentencePiece-style file's "▁" is prepended or not: at the start of
# a text, after a leading special token, before a space or a "▁" already there.
EDGE_TEXTS = ["<s>hello world", "hello<s>world", "hello <s> world", "</s>", " leading space", "  two spaces",
              "\n\nnewlines first", "a\u00e9\u4e2d\U0001F600 b", "<s> <s>", "x</s>", "tab\there", "", " ",
              "\u2581already", "a\u2581b \u2581 c", "<unk>", "a <|assistant|>  b <|assistant|>", " \u3000<|end|>\u3000 x",
              "<|end|><|end|> <|end|>", "word<|word|>word <|word|> ok <|word|>", "a new token, new  token"]


def edge_text_files(workdir):
    files = []
    for i, text in enumerate(EDGE_TEXTS):
        files.append(os.path.join(workdir, f"edge-{i}.txt"))
        with open(files[-1], "w", encoding="utf-8") as f:
            f.write(text)
    return files


def compare_documents(fsdp_data, name, tokenizer_path, texts, add_special_tokens=True):
    """encode over all the files at once, each a document, with or without
    --add-special-tokens: the ids of each file, one after another."""
    reference = Tokenizer.from_file(tokenizer_path)
    expected = []
    for t in texts:  # encode(text, add_special_tokens=True) is this post-processing of the encoding compare() checks
        expected += reference.post_process(reference_encoding(reference, tokenizer_path, t),
                                           add_special_tokens=add_special_tokens).ids
    flags = ["--add-special-tokens"] if add_special_tokens else []
    out = subprocess.run([fsdp_data, "encode", "--tokenizer", tokenizer_path, "--print-ids", "-q", *flags, *texts],
                         check=True, capture_output=True, text=True).stdout
    ours = [int(x) for x in out.split()]
    ok = ours == expected
    label = f"{name}{' --add-special-tokens' if add_special_tokens else ''} on {len(texts)} files"
    print(f"{label}: {len(expected)} tokens, {'OK' if ok else 'FAILED'}")
    return [] if ok else [f"{label}: ids differ at {first_difference(ours, expected)}"]


def added_token(content, token_id, special, **options):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not special, "special": special, **options}


def overlap_variants(workdir, made):
    """tokenizer.json files whose added_tokens overlap the vocabulary, as a
    hand-edited file can: tokenizers (0.23) ignores an added token's "id",
    giving it the vocab's id of its content, else the next id from the
    vocab's size on, in the file's order. Llama 2's <unk>, <s>, </s> (in the
    vocab and added under the same ids) and GPT-2's <|endoftext|> are the
    files as made, which must read with no warning."""
    variants = {"gpt2-added-as-made": made["gpt2"]}
    base = json.load(open(made["gpt2"], encoding="utf-8"))
    size = len(base["model"]["vocab"])
    assert "\u0120the" in base["model"]["vocab"] and "the" in base["model"]["vocab"]
    added = {
        # Content in the vocab under another id: special and not, and the file's id of another token.
        "gpt2-added-in-vocab": (base, [added_token("<|endoftext|>", 7, True), added_token("\u0120the", 3, False),
                                       added_token("the", size + 4, True)]),
        # An id the vocab gives another token; content in no vocab ("\u0120foo" decodes as " foo").
        "gpt2-added-taken-id": (base, [added_token("<|endoftext|>", 0, True), added_token("<|x|>", 10, True),
                                       added_token("<y>", 11, False), added_token("\u0120foo", 12, False)]),
        # The same content twice: with the same options (one token), and with
        # others (the first's id; the options of the one listed last).
        "gpt2-added-twice": (base, [added_token("<|endoftext|>", 0, True), added_token("<|x|>", size, True),
                                    added_token("<|x|>", size + 1, True), added_token("<y>", size + 2, False),
                                    added_token("<y>", size + 3, True, lstrip=True)]),
        # Listed out of id order, and past a gap.
        "gpt2-added-out-of-order": (base, [added_token("<|endoftext|>", 0, True), added_token("<c>", size + 2, True),
                                           added_token("<a>", size, True), added_token("<b>", size + 1, False),
                                           added_token("<d>", size + 9, True)]),
    }
    if "spm-llama2" in made:  # a normalizer (Prepend, Replace): a normalized added token decodes as it spells it
        variants["spm-llama2-as-made"] = made["spm-llama2"]
        spm = json.load(open(made["spm-llama2"], encoding="utf-8"))
        added["spm-llama2-added-overlap"] = (spm, spm["added_tokens"][:2] + [
            added_token("</s>", 5, True), added_token("new token", 3, False), added_token("\u2581the", 7, False)])
    for name, (root, tokens) in added.items():
        path = os.path.join(workdir, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**root, "added_tokens": tokens}, f, ensure_ascii=False)
        variants[name] = path
    return variants


OVERLAP_TEXT = ("<|x|>the quick <y> \u0120the there <a><b><c><d>x \u0120foo<|endoftext|>end\n"
                "<s>hello world</s> a new token, \u2581the other\n")


def compare_overlap(fsdp_data, workdir, name, tokenizer_path):
    """Ids and decode as tokenizers' (encode the text; decode its ids, and
    the ids the file gives its added tokens, which name vocab tokens where
    tokenizers moved the added one); a warning counting the file ids not
    kept and naming the first, none when all are."""
    reference = Tokenizer.from_file(tokenizer_path)
    text_file, bin_file = os.path.join(workdir, "overlap.txt"), os.path.join(workdir, "overlap.bin")
    with open(text_file, "w", encoding="utf-8") as f:
        f.write(OVERLAP_TEXT)
    expected = reference.encode(OVERLAP_TEXT, add_special_tokens=False).ids
    run = subprocess.run([fsdp_data, "encode", "--tokenizer", tokenizer_path, "-o", bin_file, "-q", text_file],
                         check=True, capture_output=True, text=True)
    data = open(bin_file, "rb").read()
    ours = list(struct.unpack(f"<{len(data) // 2}H", data))
    label = f"{name} (added tokens overlapping the vocab)"
    failures = []
    if ours != expected:
        failures.append(f"{label}: ids {ours}, tokenizers {expected}")
    tokens = json.load(open(tokenizer_path, encoding="utf-8"))["added_tokens"]
    file_ids = [t["id"] for t in tokens if reference.id_to_token(t["id"]) is not None]
    for ids in (expected, file_ids):
        with open(bin_file, "wb") as f:
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        decoded = subprocess.run([fsdp_data, "decode", "--tokenizer", tokenizer_path, bin_file], capture_output=True)
        want = reference.decode(ids, skip_special_tokens=False).encode("utf-8")
        if decoded.returncode != 0 or decoded.stdout != want:
            failures.append(f"{label}: decode of {ids}: {decoded.stdout!r} (exit {decoded.returncode}: "
                            f"{decoded.stderr.decode(errors='replace').strip()}), tokenizers {want!r}")
    moved = [t for t in tokens if reference.token_to_id(t["content"]) != t["id"]]
    if moved:
        n = len(moved)
        warning = f"warning: tokenizer '{tokenizer_path}': {n} added token{'s' if n > 1 else ''} not"
        if warning not in run.stderr or f"'{moved[0]['content']}'" not in run.stderr:
            failures.append(f"{label}: expected a warning starting {warning!r} naming '{moved[0]['content']}', "
                            f"stderr: {run.stderr!r}")
    elif "warning" in run.stderr:
        failures.append(f"{label}: a warning for a file whose ids all stand: {run.stderr!r}")
    print(f"{label}: {len(expected)} tokens, {len(moved)} ids moved, {'OK' if not failures else 'FAILED'}")
    return failures


def main():
    fsdp_data, workdir, texts = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(workdir, exist_ok=True)
    tokenizers_made = reference_tokenizers(workdir, texts)
    tokenizers_made.update(sentencepiece_tokenizers(workdir, texts[0]))
    ours = os.path.join(workdir, "fsdp-trained.json")
    subprocess.run([fsdp_data, "train-tokenizer", "--vocab-size", "1200", "-o", ours] + texts, check=True)
    tokenizers_made["fsdp-trained"] = ours  # compare() loads it with Tokenizer.from_file
    failures = []
    for name, path in tokenizers_made.items():
        for text_file in texts:
            failures += compare(fsdp_data, workdir, name, path, text_file)
        if name.startswith(("spm-", "llama3")):
            failures += compare_documents(fsdp_data, name, path, texts)
        if name.startswith("spm-"):
            failures += compare_documents(fsdp_data, name, path, edge_text_files(workdir), add_special_tokens=False)
    for name, path in overlap_variants(workdir, tokenizers_made).items():
        failures += compare_overlap(fsdp_data, workdir, name, path)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
