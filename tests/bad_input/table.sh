# The bad-input table: row TOOL STATUS TEXT COMMAND... (run.sh says what a
# row asserts). The fixtures (run.sh): text.txt, tok.json and tokens.bin
# are good; dir*, fifo*, empty.txt, odd.bin (3 bytes), not-json.json,
# garbage.safetensors, truncated.safetensors and the tok-*.json that lie
# about their ids are not; missing* names nothing. Outputs go to out/. An
# unreadable file is not a row: these tests run as root, who reads anything;
# an unwritable output is one under a regular file (text.txt/...).

# ---- fsdp-data ----
# A directory or a pipe where a file is read: refused by name, where a
# directory once hung encode (at 90 % CPU, with an empty output left).
row fsdp-data 1 "the text file 'dir' is a directory" "$data" encode --tokenizer tok.json -o out/t.bin dir
row fsdp-data 1 "the text file 'fifo' is not a regular file" "$data" encode --tokenizer tok.json -o out/t.bin fifo
row fsdp-data 1 "the text file 'missing.txt' does not exist" "$data" encode --tokenizer tok.json -o out/t.bin text.txt missing.txt
row fsdp-data 1 "the output 'dir.bin' is a directory" "$data" encode --tokenizer tok.json -o dir.bin text.txt
row fsdp-data 1 "cannot write 'text.txt/t.bin'" "$data" encode --tokenizer tok.json -o text.txt/t.bin text.txt
row fsdp-data 1 "expected a name ending in .bin" "$data" encode --tokenizer tok.json -o out/t.txt text.txt
row fsdp-data 1 "--chunk-bytes: Value 0 not in range" "$data" encode --tokenizer tok.json --chunk-bytes 0 -o out/t.bin text.txt
row fsdp-data 1 "--chunk-bytes: Value 99999999999 not in range" "$data" encode --tokenizer tok.json --chunk-bytes 99999999999 -o out/t.bin text.txt
row fsdp-data 1 "--threads: expected a number >= 0, got -1" "$data" encode --tokenizer tok.json --threads -1 -o out/t.bin text.txt
row fsdp-data 1 "--tokenizer is required" "$data" encode -o out/t.bin text.txt
row fsdp-data 1 "--bogus" "$data" encode --bogus --tokenizer tok.json -o out/t.bin text.txt
# The tokenizer.json: missing, not a file, not JSON, ids that would size
# its tables (2^31 - 1 and 4e9 once ended in std::bad_alloc, naming neither
# the file nor the entry).
row fsdp-data 1 "tokenizer 'missing.json': cannot open" "$data" encode --tokenizer missing.json -o out/t.bin text.txt
row fsdp-data 1 "tokenizer 'dir.json': is a directory" "$data" encode --tokenizer dir.json -o out/t.bin text.txt
row fsdp-data 1 "tokenizer 'fifo.json': is not a regular file" "$data" decode --tokenizer fifo.json tokens.bin
row fsdp-data 1 "tokenizer 'not-json.json': not valid JSON" "$data" decode --tokenizer not-json.json tokens.bin
row fsdp-data 1 "has id 2147483647, expected an id below 16777216" "$data" encode --tokenizer tok-id-2e31.json -o out/t.bin text.txt
row fsdp-data 1 "has id 4000000000, expected an id below 16777216" "$data" decode --tokenizer tok-id-4e9.json tokens.bin
row fsdp-data 1 "has id 1.5, expected a whole number >= 0" "$data" inspect --tokenizer tok-id-float.json tokens.bin
# One id given to two tokens reads (as `tokenizers` reads it), with a warning.
row fsdp-data 0 "warning: tokenizer 'tok-dup.json': 1 id is given to more than one token" "$data" decode --tokenizer tok-dup.json tokens.bin
# An added token's id in the file is not the one `tokenizers` gives it: read with tokenizers' id, and a warning.
row fsdp-data 0 "warning: tokenizer 'tok-added-id.json': 1 added token not given the id the file gives, the first '<x>' (id 5 in the file, given 300)" "$data" decode --tokenizer tok-added-id.json tokens.bin
# Token files: a directory named *.bin once read as "0 tokens", exit 0.
row fsdp-data 1 "the token file 'dir.bin' is a directory" "$data" inspect dir.bin
row fsdp-data 1 "the token file 'dir.bin' is a directory" "$data" decode --tokenizer tok.json dir.bin
row fsdp-data 1 "the token file 'fifo.bin' is not a regular file" "$data" inspect fifo.bin
row fsdp-data 1 "the token file 'missing.bin' does not exist" "$data" inspect missing.bin
row fsdp-data 1 "token file 'odd.bin' does not hold whole 2-byte ids" "$data" inspect odd.bin
row fsdp-data 1 "--top: expected a number >= 0, got -3" "$data" inspect --top -3 tokens.bin
# train-tokenizer: a directory once made an empty tokenizer.
row fsdp-data 1 "the text file 'dir' is a directory" "$data" train-tokenizer --vocab-size 300 -o out/t.json dir
row fsdp-data 1 "the text file 'fifo' is not a regular file" "$data" train-tokenizer --vocab-size 300 -o out/t.json fifo
row fsdp-data 1 "cannot open the text file 'missing.txt'" "$data" train-tokenizer --vocab-size 300 -o out/t.json missing.txt
row fsdp-data 1 "cannot write 'text.txt/t.json'" "$data" train-tokenizer --vocab-size 300 -o text.txt/t.json text.txt
row fsdp-data 1 "--vocab-size: expected a positive number, got 0" "$data" train-tokenizer --vocab-size 0 -o out/t.json text.txt
row fsdp-data 1 "vocab_size 100 is below 256 bytes + 1 special tokens" "$data" train-tokenizer --vocab-size 100 -o out/t.json text.txt
row fsdp-data 1 "--vocab-size: expected a number that fits in 64 bits" "$data" train-tokenizer --vocab-size 99999999999999999999 -o out/t.json text.txt
row fsdp-data 1 "vocab_size 99999999 is above 16777216" "$data" train-tokenizer --vocab-size 99999999 -o out/t.json text.txt
row fsdp-data 1 "A subcommand is required" "$data"

# ---- fsdp-plan ----
# Every number is checked by its name (0 and negatives were ignored, and the
# preset's table printed); sizes before anything is allocated (two billion
# layers once listed units until the OOM killer came); no overflow.
row fsdp-plan 1 "--layers: expected a positive number, got 0" "$plan" --preset small --layers 0
row fsdp-plan 1 "--width: expected a positive number, got -5" "$plan" --preset small --width -5
row fsdp-plan 1 "--params: expected a positive number, got inf" "$plan" --params inf --layers 4
row fsdp-plan 1 "--params: expected a positive number, got -1" "$plan" --params -1 --layers 4
row fsdp-plan 1 "--world: expected a positive number, got 0" "$plan" --preset small --world 0
row fsdp-plan 1 "--world" "$plan" --preset small --world two
row fsdp-plan 1 "--budget: expected a positive number, got nan" "$plan" --preset small --budget nan
row fsdp-plan 1 "--clip-grad-norm: expected a number >= 0, got -1" "$plan" --preset small --clip-grad-norm -1
row fsdp-plan 1 "--attention: unknown attention 'flash': expected one of auto, sdpa, written" "$plan" --preset small --attention flash
row fsdp-plan 1 "--context: expected a number that fits in 64 bits" "$plan" --preset small --context 99999999999999999999
row fsdp-plan 1 "units (layers 2000000000)" "$plan" --preset xl --layers 2000000000
row fsdp-plan 1 "beyond what 64-bit byte counts hold" "$plan" --preset small --width 1000000000
row fsdp-plan 1 "unknown preset 'enormous'" "$plan" --preset enormous
row fsdp-plan 1 "the cluster description 'dir.json' is a directory" "$plan" --preset small --cluster dir.json
row fsdp-plan 1 "the cluster description 'fifo.json' is not a regular file" "$plan" --preset small --cluster fifo.json
row fsdp-plan 1 "the cluster description 'missing.json' does not exist" "$plan" --preset small --cluster missing.json
row fsdp-plan 1 "'not-json.json': expected {flops" "$plan" --preset small --cluster not-json.json
row fsdp-plan 1 "--bogus" "$plan" --preset small --bogus
# --init-from reads only a Hugging Face model's config.json: what is not one is named.
row fsdp-plan 1 "'missing' does not exist" "$plan" --model llama --init-from missing
row fsdp-plan 1 "'dir' is not a Hugging Face model: 'dir/config.json' is missing" "$plan" --model llama --init-from dir
row fsdp-plan 1 "'fifo.json' is not a regular file" "$plan" --model llama --init-from fifo.json
row fsdp-plan 1 "'not-json.json' is not valid JSON" "$plan" --model llama --init-from not-json.json

# A regular expression from the user runs with a bound: nested quantifiers
# once spun fsdp-plan (and fsdp-train) at 100 % CPU for good.
row fsdp-plan 1 "backtracks catastrophically" "$plan" --preset tiny --freeze '^(.+)+[0-9]$'
row fsdp-plan 1 "--freeze '': expected a pattern" "$plan" --preset tiny --freeze ''
# config.json: heads that do not split the width without a head_dim (the
# head dimension was truncated, and a model transformers refuses planned),
# and a layer count no host holds (every rank allocated until the OOM killer).
hub_config() {  # JQ-FILTER: the Llama 3.2 config.json changed by it, as hub.json
  jq "$1" llama-3.2-1b.json > hub.json && "$plan" --model llama --init-from hub.json
}
row fsdp-plan 1 "\"hidden_size\" 2050 is not a multiple of \"num_attention_heads\" 32, and there is no \"head_dim\"" hub_config '.hidden_size = 2050 | del(.head_dim)'
row fsdp-plan 1 "the head dimension is 21 (\"hidden_size\" / \"num_attention_heads\"); expected an even one" hub_config '.hidden_size = 672 | del(.head_dim)'
row fsdp-plan 1 "the planner's lists of them alone take" hub_config '.num_hidden_layers = 1000000000'
row fsdp-plan 1 "beyond what 64-bit byte counts hold" hub_config '.intermediate_size = 1000000000000000'
row fsdp-plan 1 "--lora-alpha needs --lora-rank R" "$plan" --preset tiny --lora-alpha 8

# ---- fsdp-ckpt ----
row fsdp-ckpt 1 "missing.safetensors" "$ckpt" inspect missing.safetensors
row fsdp-ckpt 1 "'fifo.safetensors' is not a regular file" "$ckpt" inspect fifo.safetensors
row fsdp-ckpt 1 "garbage.safetensors" "$ckpt" verify garbage.safetensors
row fsdp-ckpt 1 "truncated.safetensors" "$ckpt" verify truncated.safetensors
row fsdp-ckpt 1 "dir" "$ckpt" verify dir
row fsdp-ckpt 1 "garbage.safetensors" "$ckpt" convert garbage.safetensors out/weights.safetensors
row fsdp-ckpt 1 "'5 GB' is not a size" "$ckpt" convert whole.safetensors out/hf --format hf --hf-shard-size "5 GB"
row fsdp-ckpt 1 "unknown dtype 'int8'" "$ckpt" convert whole.safetensors out/hf --format hf --save-dtype int8
row fsdp-ckpt 1 "--save-dtype and --source-model are for --format hf" "$ckpt" convert whole.safetensors out/w.safetensors --save-dtype bf16
row fsdp-ckpt 1 "--tokens: 'abc' is not a token id" "$ckpt" logits whole.safetensors --tokens 1,abc
row fsdp-ckpt 1 "--tokens: '-2' is not a token id" "$ckpt" logits whole.safetensors --tokens 1,-2
row fsdp-ckpt 1 "--tokens is required" "$ckpt" logits whole.safetensors
row fsdp-ckpt 1 "A subcommand is required" "$ckpt"
row fsdp-ckpt 1 "--bogus" "$ckpt" inspect --bogus whole.safetensors

# ---- fsdp-train (through fsdp-run, as users start it) ----
# With every output it writes asked for, in out/: a refused run writes none.
fsdp_train=("$run" -n 1 -- "$train" --log out/log.jsonl --summary out/summary.json --save-final out/final.safetensors)
# Numbers: finite (inf passed the checks, and trained to a NaN loss, exit 0).
row fsdp-train 1 "--lr must be a finite number, got inf" "${fsdp_train[@]}" --preset tiny --lr inf
row fsdp-train 1 "--lr must be a finite number, got nan" "${fsdp_train[@]}" --preset tiny --lr nan
row fsdp-train 1 "--clip-grad-norm: expected a number >= 0, got inf" "${fsdp_train[@]}" --preset tiny --clip-grad-norm inf
row fsdp-train 1 "--steps: expected a number that fits in 64 bits" "${fsdp_train[@]}" --preset tiny --steps 99999999999999999999
row fsdp-train 1 "--bogus" "${fsdp_train[@]}" --bogus
row fsdp-train 1 "--threads must be >= 0, got -1" "${fsdp_train[@]}" --preset tiny --threads -1
row fsdp-train 1 "--attention: unknown attention 'flash': expected one of auto, sdpa, written" "${fsdp_train[@]}" --preset tiny --attention flash
# A loss that is no longer finite stops the run, naming the step, before
# that step is saved: the newest checkpoint is the last good one.
nan_keeps_the_last_good_checkpoint() {
  "$run" -n 1 -- "$train" --preset tiny --steps 4 --lr 1e300 --ckpt-dir ckpt --ckpt-every 1 --log out/never.jsonl
  local status=$? newest
  rm -f out/never.jsonl  # the log of the steps before is the run's record (written as it goes)
  newest=$(ls ckpt | sort -V | tail -1)
  rm -rf ckpt
  [ "$newest" = step-1 ] || { echo "the newest checkpoint is '$newest', expected step-1"; return 99; }
  return $status
}
row fsdp-train 1 "step 2: the loss is" nan_keeps_the_last_good_checkpoint
# Files that are not files.
row fsdp-train 1 "data file 'dir' is a directory" "${fsdp_train[@]}" --preset tiny --data dir
row fsdp-train 1 "data file 'fifo' is not a regular file" "${fsdp_train[@]}" --preset tiny --data fifo
row fsdp-train 1 "--tokenizer" "${fsdp_train[@]}" --preset tiny --data tokens.bin --tokenizer dir.json
row fsdp-train 1 "tokenizer 'fifo.json': is not a regular file" "${fsdp_train[@]}" --preset tiny --data tokens.bin --tokenizer fifo.json
row fsdp-train 1 "has id 2147483647, expected an id below 16777216" "${fsdp_train[@]}" --preset tiny --data tokens.bin --tokenizer tok-id-2e31.json
row fsdp-train 1 "'fifo.safetensors' is not a regular file" "${fsdp_train[@]}" --preset tiny --init-from fifo.safetensors
row fsdp-train 1 "truncated.safetensors" "${fsdp_train[@]}" --preset tiny --init-from truncated.safetensors
row fsdp-train 1 "cannot open the log file 'text.txt/log.jsonl'" "$run" -n 1 -- "$train" --preset tiny --log text.txt/log.jsonl
row fsdp-train 1 "--summary: 'text.txt' is not a directory" "$run" -n 1 -- "$train" --preset tiny --steps 1 --summary text.txt/summary.json
row fsdp-train 1 "--save-final: 'text.txt' is not a directory" "$run" -n 1 -- "$train" --preset tiny --steps 1 --save-final text.txt/final.safetensors
row fsdp-train 1 "--save-dtype must be source, fp32, bf16 or fp16, got 'int8'" "${fsdp_train[@]}" --preset tiny --save-dtype int8
row fsdp-train 1 "--hf-shard-size: '0' is not a positive size" "${fsdp_train[@]}" --preset tiny --hf-shard-size 0
# Sizes before anything is allocated.
row fsdp-train 1 "units (layers 2000000000)" "${fsdp_train[@]}" --preset tiny --layers 2000000000
# A config.json that lies about the files beside it: refused naming the
# tensor, from the headers, before the model is built; and one whose layers
# no host holds, before any list of them is made.
lying_config() {  # JQ-FILTER: the Llama folder with its config.json changed by it
  made_models || return 1
  rm -rf lying && cp -r llama-hf lying && jq "$1" llama-hf/config.json > lying/config.json &&
    "$run" -n 1 -- "$train" --log out/log.jsonl --model llama --init-from lying --steps 1
}
row fsdp-train 1 "has no tensor 'model.layers.2.input_layernorm.weight'" lying_config '.num_hidden_layers = 1000000'
row fsdp-train 1 "the planner's lists of them alone take" lying_config '.num_hidden_layers = 1000000000'
row fsdp-train 1 "tensor 'model.embed_tokens.weight' has shape [256, 64], expected [256, 4096]" lying_config '.hidden_size = 4096 | .head_dim = 16'
# A half-written export (config.json comes last) is named for what it lacks.
half_written() {
  made_models || return 1
  rm -rf half && cp -r llama-hf half && rm half/config.json && "$run" -n 1 -- "$train" --log out/log.jsonl --model llama --init-from half
}
row fsdp-train 1 "'half/config.json' is missing" half_written
# --freeze: bounded, and never silently nothing.
row fsdp-train 1 "backtracks catastrophically" "${fsdp_train[@]}" --preset tiny --freeze '^(.+)+[0-9]$'
row fsdp-train 1 "--freeze '': expected a pattern" "${fsdp_train[@]}" --preset tiny --freeze ''
# LoRA's settings without LoRA were ignored: a full fine-tune, exit 0.
row fsdp-train 1 "--lora-alpha needs --lora-rank R" "${fsdp_train[@]}" --preset tiny --lora-alpha 8
row fsdp-train 1 "--lora-targets needs --lora-rank R" "${fsdp_train[@]}" --preset tiny --lora-targets c_attn
row fsdp-train 1 "--lora-dropout needs --lora-rank R" "${fsdp_train[@]}" --preset tiny --lora-dropout 0.1
# Ranges as the docs state them (CLI11's own printed 0.999000, and a 309-digit bound).
row fsdp-train 1 "--lora-dropout: expected a number in [0, 1), got 1" "${fsdp_train[@]}" --preset tiny --lora-rank 4 --lora-dropout 1
row fsdp-train 1 "--lora-alpha: expected a positive number, got 0" "${fsdp_train[@]}" --preset tiny --lora-rank 4 --lora-alpha 0
# A rank no host holds, from the flag or an adapter_config.json: named, not
# an allocator's error.
row fsdp-train 1 "--lora-rank 1000000000: lora::apply: rank 1000000000" "${fsdp_train[@]}" --preset tiny --lora-rank 1000000000 --lora-targets c_attn
huge_adapter_rank() {
  made_models || return 1
  rm -rf huge && cp -r adapter huge && jq '.r = 1000000000' adapter/adapter_config.json > huge/adapter_config.json &&
    "$run" -n 1 -- "$train" --log out/log.jsonl --preset tiny --init-from-adapter huge
}
row fsdp-train 1 "(its adapter_config.json's r = 1000000000): lora::apply: rank 1000000000" huge_adapter_rank
# Exports never write a value that is not finite: fp16's range (a weight of
# 1e5 became inf, exit 0), and a NaN in an adapter merged into the model.
fp16_overflow() {
  made_models || return 1
  rm -rf big && cp -r llama-hf big && set_first_float big/model.safetensors 47c35000 &&
    "$run" -n 1 -- "$train" --model llama --init-from big --steps 0 --save-final out/hf --save-format hf --save-dtype fp16
}
row fsdp-train 1 "value(s) beyond Half's range (its largest magnitude is 100000" fp16_overflow
nan_adapter_merged() {
  made_models || return 1
  rm -rf nan && cp -r adapter nan && set_first_float nan/adapter_model.safetensors 7fc00000 &&
    "$run" -n 1 -- "$train" --preset tiny --init-from-adapter nan --steps 0 --save-final out/merged --save-format hf --merge-lora
}
row fsdp-train 1 "that are not finite (NaN or inf): refused, nothing written" nan_adapter_merged
# A preemption while the run is still being set up ends it at once (it
# waited for a first step that could be minutes away), leaving nothing: 76,
# or 75 with --ckpt-dir (what that folder holds is the newest state).
row fsdp-train 76 "preempted (SIGTERM or SIGUSR1) before the first step" env FSDP_TEST_SIGNAL_IN_SETUP=0 "$run" -n 2 -- "$train" --preset tiny --log out/log.jsonl --plot out/plot --summary out/summary.json
row fsdp-train 75 "preempted (SIGTERM or SIGUSR1) before the first step" env FSDP_TEST_SIGNAL_IN_SETUP=0 "${fsdp_train[@]}" --preset tiny --ckpt-dir ck-preempted
# One job at a time in a checkpoint folder: a second is refused naming the
# first (here flock(1) holds the lock as a running job's rank 0 would).
second_job() {
  mkdir -p ck-held && echo "host elsewhere, pid 4242" > ck-held/.fsdp-lock &&
    flock -n ck-held/.fsdp-lock "$run" -n 1 -- "$train" --log out/log.jsonl --preset tiny --steps 1 --ckpt-dir ck-held
}
row fsdp-train 1 "checkpoint folder 'ck-held' is in use by another job (host elsewhere, pid 4242)" second_job
# ... and a lock its holder left behind (it died) is taken over.
stale_lock() {
  mkdir -p ck-stale && echo "host gone, pid 4242" > ck-stale/.fsdp-lock &&
    "$run" -n 1 -- "$train" --preset tiny --steps 1 --ckpt-dir ck-stale && echo "took the folder over"
}
row fsdp-train 0 "took the folder over" stale_lock
# A checkpoint of another family is refused by its family, before its
# tensors are read (it was refused by the units' layout, and at W = 2 a
# rank's "preempted" line could follow the error).
other_family_resumed() {
  "$run" -n 1 -- "$train" --model llama --preset tiny --steps 1 --ckpt-dir ck-llama --ckpt-every 1 > /dev/null || return 98
  "$run" -n 2 -- "$train" --log out/log.jsonl --preset tiny --steps 2 --ckpt-dir ck-llama --resume 2>&1 | tee resumed.out
  local status=${PIPESTATUS[0]}
  tail -1 resumed.out | grep -q "holds a llama model" || { echo "the last line does not name the family"; return 99; }
  return "$status"
}
row fsdp-train 1 "holds a llama model (vocab 256" other_family_resumed
# A rank's own error reaches the user, whichever rank fails first, as the
# last line: a full disk under --save-final at W = 2 once printed only
# "another rank failed; see its message".
full_disk_save() {
  mkdir -p full && unshare -m bash -c 'mount -t tmpfs -o size=32k tmpfs full &&
    "$run" -n 2 -- "$train" --preset tiny --steps 1 --save-final full/final.safetensors' 2>&1 | tee full.out
  local status=${PIPESTATUS[0]}
  tail -1 full.out | grep -q "No space left on device" || { echo "the last line does not name the full disk"; return 99; }
  return "$status"
}
row fsdp-train 1 "No space left on device" full_disk_save
# ... and a Hugging Face export that the disk cannot hold leaves no folder
# behind (it left an empty one).
full_disk_hf_export() {
  mkdir -p full-hf && unshare -m bash -c 'mount -t tmpfs -o size=32k tmpfs full-hf &&
    { "$run" -n 1 -- "$train" --preset tiny --steps 1 --save-final full-hf/export --save-format hf; status=$?
      [ ! -e full-hf/export ] || { echo "full-hf/export left behind"; exit 99; }; exit $status; }'
}
row fsdp-train 1 "No space left on device" full_disk_hf_export

# ---- fsdp-run ----
row fsdp-run 1 "-n needs a positive number of ranks, got '0'" "$run" -n 0 -- true
row fsdp-run 1 "-n needs a positive number of ranks, got 'two'" "$run" -n two -- true
row fsdp-run 1 "--threads needs a positive number, got '0'" "$run" -n 1 --threads 0 -- true
row fsdp-run 1 "unknown option '--bogus'" "$run" --bogus -n 1 -- true
row fsdp-run 1 "no program given after --" "$run" -n 1 --
row fsdp-run 127 "cannot run 'missing-program': no such program" "$run" -n 2 -- missing-program
row fsdp-run 127 "cannot run './text.txt': no such program" "$run" -n 1 -- ./text.txt
row fsdp-run 1 "cannot read the hostfile 'missing.hosts'" "$run" --hostfile missing.hosts -- true
row fsdp-run 0 "usage: fsdp-run" "$run" --help
# SIGTERM to the launcher's whole process group (a scheduler's preemption):
# the ranks' 75 is the job's (it was mpirun's 1, mpirun being signalled too).
# Which rank's line reaches the output first is a race (mpirun ends the
# other once one has exited: rank 1's line was lost once, in a CI run), so
# the row asks for a rank's line, not rank 1's.
row fsdp-run 75 "stopping: preempted" signal_group TERM 2 "$run" -n 2 -- bash rank75.sh
