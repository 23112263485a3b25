#!/usr/bin/env python3
"""Single-threaded encode throughput of the `tokenizers` package, the same way
bench/tokenizer_bench.cpp measures fsdp-cpp's: the file read as UTF-8 with
errors='replace', in chunks of LINES lines, encode() one after another, REPS
times on one Tokenizer (its cache persists). Run with RAYON_NUM_THREADS=1
TOKENIZERS_PARALLELISM=false (bench/tokenizer.sh does).
  tokenizer.py TOKENIZER_JSON TEXT_FILE [LINES=1000] [REPS=3]"""
import json
import sys
import time

from tokenizers import Tokenizer

path, text_file = sys.argv[1], sys.argv[2]
lines = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
tok = Tokenizer.from_file(path)
raw = open(text_file, "rb").read()
text = raw.decode("utf-8", errors="replace")
all_lines = [line + "\n" for line in text.split("\n")]  # split at "\n" only, as the C++ side does
all_lines[-1] = all_lines[-1][:-1]
chunks = ["".join(all_lines[i:i + lines]) for i in range(0, len(all_lines), lines)]
seconds = []
for _ in range(reps):
    t0 = time.perf_counter()
    tokens = sum(len(tok.encode(c, add_special_tokens=False).ids) for c in chunks)
    seconds.append(time.perf_counter() - t0)
seconds.sort()
median = seconds[len(seconds) // 2]
print(json.dumps({"impl": "tokenizers " + __import__("tokenizers").__version__, "bytes": len(raw), "tokens": tokens,
                  "best_s": round(seconds[0], 4), "median_s": round(median, 4),
                  "MB_per_s": round(len(raw) / 1e6 / median, 2)}))
