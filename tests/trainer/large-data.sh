#!/usr/bin/env bash
# A token file larger than what a rank may hold: 3 GB of uint16 tokens (a
# sparse file of zeros, 1.5 G tokens: the old reader needed 15 GB per rank
# for it). TokenData maps the file instead of reading it, and checks the
# token range in one pass that gives the pages back: each rank's peak RSS
# stays within 64 MiB of the same run on the built-in corpus, and the
# validation split at the file's tail is read like any other. A token out of
# range past the first gigabyte is still found before training, named with
# its position.
source "$(dirname "$0")/lib.sh" "$@"

truncate -s 3G "$work/big.bin"
common=(--preset tiny --steps 3 --eval-every 3 --eval-sequences 8)
train_run corpus 2 "${common[@]}"
train_run big 2 "${common[@]}" --data "$work/big.bin"
log_ok "$work/big.jsonl" 'all(.loss | isnormal)' "non-finite loss on the big file"
json_ok "$work/big.json" '.final_val_loss | isnormal' "no validation loss on the big file"
small=$(summary "$work/corpus.json" '.peak_rss_bytes | max')
big=$(summary "$work/big.json" '.peak_rss_bytes | max')
echo "peak RSS: $((small / 1048576)) MiB on the corpus, $((big / 1048576)) MiB on the 3 GB file"
[ $(( big - small )) -lt $(( 64 * 1048576 )) ] || fail "a rank's RSS grew by $(( (big - small) / 1048576 )) MiB with the file"

# Token 300 (vocab 256) at token position 600,000,000 (byte 1.2 GB).
printf '\x2c\x01' | dd of="$work/big.bin" bs=1 seek=1200000000 conv=notrunc 2>/dev/null
expect_error "token id 300 at position 600000000" "$run" -n 2 -- "$train" --preset tiny --steps 1 --data "$work/big.bin"
pass
