#!/usr/bin/env bash
# Bad data, options and init files are refused with a message naming the
# problem (the messages are the interface here), leaving no files behind.
source "$(dirname "$0")/lib.sh" "$@"

printf 'short' > "$work/short.txt"
expect_error "holds 5 tokens, too few for one training sequence" "$run" -n 2 -- "$train" --preset tiny --data "$work/short.txt" --log "$work/never.jsonl"
[ ! -e "$work/never.jsonl" ] || fail "a failed run left a log file"
expect_error "cannot open data file" "$run" -n 2 -- "$train" --preset tiny --data "$work/missing.txt"
expect_error "--bogus" "$run" -n 2 -- "$train" --bogus
expect_error "unknown preset 'enormous'" "$run" -n 2 -- "$train" --preset enormous
expect_error "must be a multiple of the number of heads" "$run" -n 2 -- "$train" --preset tiny --heads 3
# Init files: a missing tensor and a mis-shaped one (saved from another config).
train_run one_layer 2 --preset tiny --layers 1 --steps 1 --save-final "$work/one_layer.safetensors"
expect_error "has no tensor 'transformer.h.1.ln_1.weight'" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/one_layer.safetensors" --save-final "$work/never.safetensors"
train_run narrow 2 --preset tiny --width 32 --heads 4 --steps 1 --save-final "$work/narrow.safetensors"
expect_error "tensor 'transformer.wte.weight' has shape [256, 32], expected [256, 64]" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/narrow.safetensors"
printf 'not a safetensors file at all' > "$work/garbage.safetensors"
expect_error "header length" "$run" -n 2 -- "$train" --preset tiny --init-from "$work/garbage.safetensors"
[ ! -e "$work/never.safetensors" ] && [ ! -e "$work/never.safetensors.tmp" ] || fail "a failed run left a weights file"
expect_error "fsdp-run: -n needs a positive number of ranks" "$run" -n 0 -- "$train"
expect_error "--ranks-per-node must be a positive divisor of -n 4" "$run" -n 4 --ranks-per-node 3 -- "$train"
pass
