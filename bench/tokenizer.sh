#!/usr/bin/env bash
# Encode throughput, single-threaded: fsdp-cpp's tokenizer against the
# `tokenizers` package on the same tokenizer.json and text, alternating, under
# the measurement lock. Two tokenizers: GPT-2 style (fsdp-data train-tokenizer,
# vocab 4096) and Llama 3 style (tokenizers' BpeTrainer, vocab 4096); two
# texts: the built-in corpus and the corpus repeated to ~20 MB.
#   bench/tokenizer.sh [BUILD_DIR=build]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
python="${FSDP_TEST_PYTHON:-$PWD/.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
corpus=data/default_corpus.txt
for _ in $(seq 85); do cat "$corpus"; done > "$work/corpus-20mb.txt"
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
for tokenizer in gpt2-style llama3-style; do
  for text in "$corpus" "$work/corpus-20mb.txt"; do
    echo "# $tokenizer on $(basename "$text") ($(stat -c %s "$text") bytes), chunks of 1000 lines, median of 3"
    for round in 1 2; do  # alternating, twice
      flock /tmp/fsdp-measure.lock "$build/fsdp-bench-tokenizer" "$work/$tokenizer.json" "$text" 1000 3
      flock /tmp/fsdp-measure.lock "$python" bench/tokenizer.py "$work/$tokenizer.json" "$text" 1000 3
    done
  done
done
