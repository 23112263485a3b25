# fsdp-ckpt inspects, verifies and converts without starting any rank; on a
# checkpoint folder (--ckpt-dir) it lists the checkpoints, newest first,
# complete or unfinished.
ckpt="$build/fsdp-ckpt"

# bytes_of OUTPUT TENSOR: the byte count inspect prints for a tensor.
bytes_of() { awk -v t="$2" '$1 == t { print $(NF - 1) }' <<<"$1"; }
# listing OUTPUT: "name state" per checkpoint of a folder's listing, in order.
listing() { awk 'NR > 1 { print $1, $2 }' <<<"$1"; }

train_run sharded 4 --preset tiny --steps 3 --strategy zero1 --ckpt-dir "$work/ck" --ckpt-every 3 \
  --save-final "$work/direct.safetensors"
jq -e '.step == 3 and .world_size == 4 and .strategy == "zero1" and .shard_group_size == 4 and .optimizer.step == 3' \
  "$work/ck/step-3/metadata.json" >/dev/null || fail "the checkpoint's metadata: $(jq -c 'del(.units, .files)' "$work/ck/step-3/metadata.json")"
out=$("$ckpt" inspect "$work/ck/step-3") || fail "inspect failed"
[ "$(bytes_of "$out" transformer.h.1.mlp.c_fc.weight)" = 65536 ] || { echo "$out"; fail "inspect lacks a tensor's bytes"; }
"$ckpt" verify "$work/ck/step-3" >/dev/null || fail "verify of a good checkpoint failed"
"$ckpt" verify "$work/direct.safetensors" >/dev/null || fail "verify of a full weights file failed"
"$ckpt" convert "$work/ck/step-3" "$work/converted.safetensors" >/dev/null || fail "convert failed"
# The last line of a file's inspection: "N tensors, M elements".
[ "$("$ckpt" inspect "$work/converted.safetensors" | tail -1 | awk '{ print $1, $3 }')" = "28 118528" ] ||
  fail "converted file incomplete"
# The converted file holds the same weights as the trainer's own full save.
train_run a 1 --preset tiny --steps 1 --init-from "$work/converted.safetensors"
train_run b 1 --preset tiny --steps 1 --init-from "$work/direct.safetensors"
same_losses "$work/a.jsonl" "$work/b.jsonl" 1

# The same run with full checkpoints: its model file is a weights file as
# it is, and converting the checkpoint gives the same weights.
train_run full 4 --preset tiny --steps 3 --strategy zero1 --ckpt-dir "$work/ckf" --ckpt-every 3 --ckpt-format full
jq -e '.format == "fsdp-full-v1" and .step == 3 and .world_size == 4' "$work/ckf/step-3/metadata.json" >/dev/null ||
  fail "the full checkpoint's metadata"
"$ckpt" inspect "$work/ckf/step-3" >/dev/null || fail "inspect of a full checkpoint failed"
[ "$(jq '.files | length' "$work/ckf/step-3/metadata.json")" = 2 ] || fail "a full checkpoint is not 2 files"
"$ckpt" verify "$work/ckf/step-3" >/dev/null || fail "verify of a full checkpoint failed"
"$ckpt" convert "$work/ckf/step-3" "$work/from-full.safetensors" >/dev/null || fail "convert of a full checkpoint failed"
for f in from-full.safetensors ckf/step-3/model.safetensors; do
  train_run c 1 --preset tiny --steps 1 --init-from "$work/$f"
  same_losses "$work/c.jsonl" "$work/b.jsonl" 1
done

# A checkpoint folder: two complete checkpoints (step-2 pruned by
# --ckpt-keep 2) and a save that never finished, in the middle.
train_run folder 2 --preset tiny --steps 6 --ckpt-dir "$work/runs" --ckpt-every 2 --ckpt-keep 2 --strategy shard_grad_op
mkdir "$work/runs/step-5.tmp" && cp "$work/runs/step-4/shard-0.safetensors" "$work/runs/step-5.tmp/"
out=$("$ckpt" inspect "$work/runs") || { echo "$out"; fail "inspect of a checkpoint folder failed"; }
echo "$out"
[ "$(listing "$out")" = "$(printf 'step-6 complete\nstep-5.tmp unfinished\nstep-4 complete')" ] ||
  { echo "$out"; fail "the folder's listing is not step-6, step-5.tmp, step-4 with their states"; }
# Each complete line carries its metadata's figures.
for step in 6 4; do
  line=$(awk -v n="step-$step" '$1 == n' <<<"$out")
  for figure in "$(jq -r .strategy "$work/runs/step-$step/metadata.json")" "step $(jq .step "$work/runs/step-$step/metadata.json")" \
                "world size $(jq .world_size "$work/runs/step-$step/metadata.json")" sharded; do
    grep -qF -- "$figure" <<<"$line" || fail "step-$step's line lacks '$figure': $line"
  done
done
# A complete-looking step-N whose metadata is corrupt or missing is unfinished too.
jq '.step = 40' "$work/runs/step-4/metadata.json" > "$work/meta.json" && mv "$work/meta.json" "$work/runs/step-4/metadata.json"
mkdir "$work/runs/step-1"
out=$("$ckpt" inspect "$work/runs") || fail "inspect of a folder with a corrupt checkpoint failed"
[ "$(listing "$out")" = "$(printf 'step-6 complete\nstep-5.tmp unfinished\nstep-4 unfinished\nstep-1 unfinished')" ] ||
  { echo "$out"; fail "a corrupt or missing metadata.json is not marked unfinished"; }
grep -qF "metadata.json' is corrupt" <<<"$(awk '$1 == "step-4"' <<<"$out")" || { echo "$out"; fail "step-4 does not say its metadata is corrupt"; }
grep -qF "has no metadata.json" <<<"$(awk '$1 == "step-1"' <<<"$out")" || { echo "$out"; fail "step-1 does not say it has no metadata"; }
mkdir "$work/empty"
expect_error "is not a complete checkpoint (it has no metadata.json) nor a checkpoint folder" "$ckpt" inspect "$work/empty"

corrupt_byte "$work/ck/step-3/shard-2.safetensors"
expect_error "shard-2.safetensors' is corrupt" "$ckpt" verify "$work/ck/step-3"
corrupt_byte "$work/direct.safetensors"
expect_error "direct.safetensors' is corrupt" "$ckpt" verify "$work/direct.safetensors"
expect_error "direct.safetensors' is corrupt" "$run" -n 2 -- "$train" --preset tiny --steps 1 --init-from "$work/direct.safetensors"
expect_error "is not a complete checkpoint" "$ckpt" convert "$work" "$work/x.safetensors"
[ ! -e "$work/x.safetensors" ] || fail "a failed convert left a file"

# Checksums: new files name XXH3-64; a checkpoint from before XXH3
# (tests/fixtures: FNV-1a, named nowhere) still verifies, shows its
# algorithm and converts.
jq -e '.checksum_algorithm == "xxh3_64"' "$work/runs/step-6/metadata.json" >/dev/null ||
  fail "metadata.json does not name xxh3_64"
out=$("$ckpt" inspect "$work/runs/step-6") || fail "inspect of step-6 failed"
[ "$(grep -cE '^    (shard-[01]\.safetensors|metadata\.json) [0-9]+ B, xxh3_64 [0-9a-f]{16}$' <<<"$out")" = 3 ] ||
  { echo "$out"; fail "inspect does not show xxh3_64 for the 2 shards and the metadata"; }
old="$here/../fixtures/checkpoint-fnv1a64/step-2"
"$ckpt" verify "$old" >/dev/null || fail "a checkpoint from before XXH3 does not verify"
out=$("$ckpt" inspect "$old") || fail "inspect of a checkpoint from before XXH3 failed"
[ "$(grep -cE '^    (shard-[012]\.safetensors|metadata\.json) [0-9]+ B, fnv1a64 [0-9a-f]{16}$' <<<"$out")" = 4 ] ||
  { echo "$out"; fail "inspect does not show fnv1a64 for the 3 old shards and their metadata"; }
"$ckpt" convert "$old" "$work/old.safetensors" >/dev/null && "$ckpt" verify "$work/old.safetensors" >/dev/null ||
  fail "a checkpoint from before XXH3 does not convert to a file that verifies"
