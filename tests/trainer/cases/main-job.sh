# The main job as the README runs it (scripts/main.sh: the tokenizer trained
# on the built-in corpus and the corpus encoded, both cached in data/, then
# 2 ranks training on the tokens), on a shorter schedule: 120 steps at twice
# the learning rate instead of the default 250 (the README's figures), with
# the validation loss every 40. It ends with a sample decoded to text and
# the summary, and at least 70 % of the sample's whitespace-separated words
# are words of the corpus (the figure is printed; 81 of 99 on 2026-12-04);
# the validation loss is also given in bits per byte, fewer than its bits per
# token (a token is more than a byte). The options replacing main.sh's
# defaults are the path a user's own --steps takes. Against the default
# LibTorch only: the job takes minutes, and what it runs is code the other
# cases test against both.
source "$here/../../scripts/libtorch_kinds.sh"
root="$(cd "$here/../.." && pwd)"
[ "$build" = "$root/$(build_dir "$default_libtorch_kind")" ] ||
  skip "the main job runs once, against the default LibTorch's build ($(build_dir "$default_libtorch_kind")/), not $build"
out="$work/main.out"
FSDP_BUILD_DIR="$build" bash "$root/scripts/main.sh" --steps 120 --lr 2e-3 --warmup-steps 12 --eval-every 40 \
  --summary "$work/main.json" > "$out" 2>&1 ||
  { tail -40 "$out" >&2; fail "scripts/main.sh failed"; }
grep -q "^== summary ==" "$out" || fail "no summary"
json_is "$work/main.json" '.final_val_bpb > 0 and .final_val_bpb < .final_val_loss / 0.6931' true
# The sample: from its heading to the summary's.
sed -n '/^== sample/,/^== summary ==$/p' "$out" | sed '1d;$d' > "$work/sample.txt"
read -r known words < <(awk 'NR == FNR { for (i = 1; i <= NF; ++i) seen[$i] = 1; next }
                             { for (i = 1; i <= NF; ++i) { ++n; if ($i in seen) ++k } }
                             END { print k + 0, n + 0 }' "$root/data/default_corpus.txt" "$work/sample.txt")
echo "the main job's sample: $known of its $words words occur in the corpus ($(( 100 * known / (words ? words : 1) )) %)"
cat "$work/sample.txt"
[ "$words" -ge 20 ] || fail "the sample has only $words words: is it decoded text?"
[ $(( 100 * known )) -ge $(( 70 * words )) ] || fail "only $known of $words sample words occur in the corpus (want >= 70 %)"
