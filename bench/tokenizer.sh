#!/usr/bin/env bash
# Encode throughput, single-threaded: fsdp-cpp's tokenizer against the
# `tokenizers` package on the same tokenizer.json and text, alternating, under
# the measurement lock. Tokenizers: GPT-2 style (fsdp-data train-tokenizer,
# vocab 4096), Llama 3 style (tokenizers' BpeTrainer, vocab 4096), and
# gpt2-real: GPT-2's real vocabulary (50,257 tokens) from the pinned
# gpt2.tiktoken (scripts/python_refs.sh; $FSDP_TEST_ASSETS, else .venv/assets/),
# built as tests/text/tiktoken_reference.py does; spm-llama2 (asked for by
# name): a SentencePiece-style BPE (byte_fallback, vocab 4096) in Llama 2's
# tokenizer.json form, built as tests/text/tokenizer_reference.py does. Two texts: the built-in
# corpus, the corpus repeated to ~20 MB, and 20 MB of transformers' sources. Then, on gpt2-real and the 20 MB
# text, fsdp-data encode's wall time with --threads 1 and 2, alternating.
#   bench/tokenizer.sh [BUILD_DIR=build [TOKENIZER...=gpt2-style llama3-style gpt2-real; or spm-llama2]]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
shift || true
tokenizers=("$@")
[ ${#tokenizers[@]} -gt 0 ] || tokenizers=(gpt2-style llama3-style gpt2-real)
python="${FSDP_TEST_PYTHON:-$PWD/.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
corpus=data/default_corpus.txt
for _ in $(seq 85); do cat "$corpus"; done > "$work/corpus-20mb.txt"
# 20 MB of varied text (not one text repeated, so caches help less): transformers' Python sources.
find "$("$python" -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" -name '*.py' |
  sort | xargs cat 2>/dev/null | head -c 20000000 > "$work/code-20mb.txt" || true
"$build/fsdp-data" train-tokenizer --vocab-size 4096 -o "$work/gpt2-style.json" "$corpus" 2>/dev/null
"$python" - "$corpus" "$work/llama3-style.json" <<'PY'
import sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"], show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(sys.argv[2])
PY
wants() { [[ " ${tokenizers[*]} " == *" $1 "* ]]; }
wants spm-llama2 && "$python" - "$corpus" "$work" <<'PY'
import shutil, sys
sys.path.insert(0, "tests/text")
from tokenizer_reference import sentencepiece_tokenizers
made = sentencepiece_tokenizers(sys.argv[2], sys.argv[1], vocab_size=4096)
shutil.copy(made["spm-llama2"], sys.argv[2] + "/spm-llama2.json")
PY
wants_gpt2_real() { wants gpt2-real; }
wants_gpt2_real && "$python" - "${FSDP_TEST_ASSETS:-.venv/assets}/gpt2.tiktoken" "$work/gpt2-real.json" <<'PY'
import sys
sys.path.insert(0, "tests/text")
from tiktoken_reference import tokenizer_from_tiktoken
tokenizer_from_tiktoken(sys.argv[1], sys.argv[2])
PY
for tokenizer in "${tokenizers[@]}"; do
  for text in "$corpus" "$work/corpus-20mb.txt" "$work/code-20mb.txt"; do
    echo "# $tokenizer on $(basename "$text") ($(stat -c %s "$text") bytes), chunks of 1000 lines, median of 3"
    for round in 1 2; do  # alternating, twice
      flock /tmp/fsdp-measure.lock "$build/fsdp-bench-tokenizer" "$work/$tokenizer.json" "$text" 1000 3
      flock /tmp/fsdp-measure.lock "$python" bench/tokenizer.py "$work/$tokenizer.json" "$text" 1000 3
    done
  done
done
wants_gpt2_real || exit 0
echo "# fsdp-data encode, gpt2-real on corpus-20mb.txt: wall seconds by --threads, alternating"
for round in 1 2 3; do
  for threads in 1 2; do
    flock /tmp/fsdp-measure.lock bash -c 'start=$(date +%s.%N)
      "$0/fsdp-data" encode --tokenizer "$1/gpt2-real.json" --threads "$2" -q -o "$1/out.bin" "$1/corpus-20mb.txt"
      echo "threads $2: $(awk "BEGIN { print $(date +%s.%N) - $start }") s"' "$build" "$work" "$threads"
  done
done
