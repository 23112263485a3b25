#!/usr/bin/env bash
# The main job: set up, build, train a byte-level BPE tokenizer on the
# built-in corpus and encode the corpus with it (fsdp-data; both cached in
# data/ after the first run), then train the reference GPT (preset small,
# 250 steps) with FULL_SHARD on 2 local ranks on those tokens, in the
# shuffled order with clipping, a warmup-plus-cosine schedule, and the
# validation loss (also in bits per byte) every 50 steps; then the trained
# model writes a sample, decoded to text, and rank 0 prints the summary.
# Extra arguments go to fsdp-train, e.g.  scripts/main.sh --steps 300
# (one of the options below given there replaces the default here; --data or
# --tokenizer replaces both, and with them the tokenizer step).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch_kinds.sh
kind="${FSDP_LIBTORCH_KIND:-$default_libtorch_kind}"
bash scripts/setup.sh "$kind"
build="$(build_dir "$kind")"
vocab="${FSDP_MAIN_VOCAB:-1024}"  # the tokenizer's vocabulary (FSDP_MAIN_VOCAB overrides)
corpus=data/default_corpus.txt tokenizer="data/tokenizer-$vocab.json" tokens="data/default_corpus-$vocab.bin"
# Defaults of the main job, each dropped when the caller gives that option.
declare -A defaults=([--steps]=250 [--sample]=160 [--lr-schedule]=cosine [--warmup-steps]=25 [--eval-every]=50
                     [--data]="$tokens" [--tokenizer]="$tokenizer")
for arg in "$@"; do
  option="${arg%%=*}"
  case "$option" in --data|--tokenizer) unset "defaults[--data]" "defaults[--tokenizer]" ;; esac
  unset "defaults[$option]" 2>/dev/null || true
done
if [ -n "${defaults[--tokenizer]:-}" ]; then
  # Made again when missing or older than what it is made from.
  if [ ! -s "$tokenizer" ] || [ "$corpus" -nt "$tokenizer" ]; then
    "$build/fsdp-data" train-tokenizer --vocab-size "$vocab" -o "$tokenizer" "$corpus"
  fi
  if [ ! -s "$tokens" ] || [ "$tokenizer" -nt "$tokens" ]; then
    "$build/fsdp-data" encode --tokenizer "$tokenizer" -o "$tokens" "$corpus"
  fi
fi
extra=()
for option in "${!defaults[@]}"; do extra+=("$option" "${defaults[$option]}"); done
exec "$build/fsdp-run" -n "${FSDP_RANKS:-2}" -- "$build/fsdp-train" --log "$build/train.jsonl" "${extra[@]}" "$@"
