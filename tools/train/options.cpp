// fsdp-train's command line: each option bound to its TrainOptions field.

#include "train/options.h"

namespace fsdp_train {
namespace {

// The model, the optimizer, the device.
void add_model_options(CLI::App& app, TrainOptions& o) {
  fsdp_tools::add_model_flags(app, o, "",
                              "initial weights: a .safetensors of the spec's names, or a Hugging Face model (a folder "
                              "with config.json and model.safetensors or the shards its model.safetensors.index.json "
                              "names, or that model.safetensors: the shape from config.json; each rank reads only its "
                              "own shards), or a config.json alone: its shape, initialized as the model's own init "
                              "does (with --sharded-init, unit by unit)");
  app.add_option("--steps", o.steps, "optimizer steps (0: none, the model as loaded written to --save-final)")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--adamw", o.adamw, "fused (fsdp::FusedAdamW: one vectorized, multi-threaded pass) or torch "
                                     "(torch::optim::AdamW); checkpoints of either resume with either")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu, or cuda (rank r of a host on its GPU r mod the GPUs it sees)")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "collectives: mpi, nccl (a GPU per rank), or auto (nccl where every rank has its own GPU)")
      ->capture_default_str();
}

// Offload and the preflight.
void add_offload_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--offload", o.offload,
                 "none, or cpu: fp32 shards, gradients and optimizer state in host memory, optimizer step on the CPU "
                 "(sharded strategies)")
      ->capture_default_str();
  app.add_option("--offload-optimizer", o.offload_optimizer,
                 "none, or nvme: AdamW's moments (and the fp32 masters of bf16/fp16 parameters) in a scratch file "
                 "in --offload-dir between steps, each unit stepped during backward as soon as its gradient is reduced")
      ->capture_default_str();
  app.add_option("--offload-params", o.offload_params,
                 "none, or nvme: the parameter shards on disk, read before each all-gather (sharded strategies; with "
                 "bf16/fp16 parameters together with --offload-optimizer nvme)")
      ->capture_default_str();
  app.add_option("--offload-dir", o.offload_dir, "the folder of the nvme offload's scratch files (one per rank)");
  app.add_option("--offload-read-ahead-max", o.offload_read_ahead_max,
                 "nvme offload: after a step in which compute waited on the disk for 2 % of it or more, read one "
                 "unit deeper, up to this, or to the deepest the preflight finds fits the host (--offload-read-ahead's "
                 "value or less: the depth stays fixed)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--offload-engine", o.offload_engine,
                 "auto (libaio with O_DIRECT where the file system takes it, else threads), libaio, or threads "
                 "(pread/pwrite)")
      ->capture_default_str();
  app.add_flag("--no-preflight", o.no_preflight,
               "skip the check that the planner's memory for this run fits the host's available memory");
}

// Data, evaluation, weights in and out, logging.
void add_data_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--seed", o.seed, "initialization seed")->capture_default_str();
  app.add_option("--data", o.data,
                 "token file: raw bytes, .bin of uint16 or .u32 of uint32 tokens (default: built-in corpus); with "
                 "the .mask and .conversations files fsdp-data encode-chat writes beside it, conversations: the "
                 "loss on their answers only, packed without attention across them");
  app.add_flag("--pack,!--no-pack", o.pack,
               "conversations: several a row, best fit (--no-pack: one a row, padded to --context)")
      ->capture_default_str();
  app.add_option("--data-order", o.data_order,
                 "shuffled (each sequence's start drawn from its global index) or sequential (consecutive sequences)")
      ->capture_default_str();
  app.add_option("--data-seed", o.data_seed, "seed of the shuffled data order")->capture_default_str();
  app.add_option("--val-fraction", o.val_fraction,
                 "hold out this last fraction of the data for validation, in [0, 1) (0: none)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every,
                 "compute the validation loss every K steps and after the last (0: never)")
      ->capture_default_str();
  app.add_option("--eval-sequences", o.eval_sequences,
                 "validation sequences per evaluation, a multiple of the world size (default: 64 rounded up to one)");
  app.add_option("--tokenizer", o.tokenizer,
                 "a Hugging Face tokenizer.json: the vocabulary, --prompt encoded, the sample decoded (--data: its ids)")
      ->check(CLI::ExistingFile);
  fsdp_tools::add_fine_tune_flags(app, o);
  app.add_option("--save-final", o.save_final, "write the trained weights here (.safetensors; --save-format hf: a folder)");
  app.add_option("--save-format", o.save_format,
                 "spec: one .safetensors of the spec's names; hf: a Hugging Face folder (model.safetensors or its "
                 "shards and index, config.json, --init-from's tokenizer and chat template files, --tokenizer's "
                 "tokenizer.json) that transformers' from_pretrained loads, streamed from the gathered units; "
                 "peft: a LoRA run's adapters as a PEFT folder (adapter_model.safetensors, adapter_config.json) that "
                 "peft's PeftModel.from_pretrained loads over the base model")
      ->check(CLI::IsMember({"spec", "hf", "peft"}))
      ->capture_default_str();
  app.add_option("--save-dtype", o.save_dtype,
                 "--save-format hf and peft: the weights' dtype, fp32, bf16 or fp16; source: that of --init-from's "
                 "Hugging Face weights (BF16 for a BF16 download), else fp32 (adapters: fp32)")
      ->capture_default_str();
  app.add_flag("--merge-lora", o.merge_lora,
               "--save-format hf of a LoRA run: write each adapted weight as W + (alpha / r) B A under the base "
               "model's names, without the adapters: a plain model for from_pretrained");
  app.add_option("--hf-shard-size", o.hf_shard_size,
                 "--save-format hf: the largest weight file (\"5GB\", \"500MB\", \"2GiB\" or bytes); more weights "
                 "are written in shards with model.safetensors.index.json, as save_pretrained's max_shard_size")
      ->capture_default_str();
  app.add_option("--log", o.log, "JSON lines, one per step");
  app.add_option("--threads", o.threads, "LibTorch threads per rank (default: from fsdp-run, else cores / ranks)");
  app.add_option("--print-every", o.print_every, "progress line interval (default: steps / 20)");
}

// Sharding, precision, accumulation, the schedule.
void add_parallel_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--strategy", o.strategy,
                 "no_shard, zero1, shard_grad_op, full_shard, hybrid_shard, hybrid_shard_zero2, or auto")
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "hybrid strategies and ZeRO++: ranks per (simulated) node (default: from fsdp-run, else MPI's "
                 "shared-memory nodes)");
  app.add_option("--memory-budget", o.memory_budget,
                 "--strategy auto: per-rank bytes for model state plus gathered parameters "
                 "(the rule of fsdp-plan --budget)");
  app.add_option("--grad-accum", o.grad_accum, "micro-steps per optimizer step")->capture_default_str();
  app.add_flag("--no-sync", o.no_sync,
               "with --grad-accum: skip the reduction before the last micro-step also for sharded-gradient "
               "strategies (keeps full-size gradients between micro-steps)");
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, or cosine (to --min-lr at the last step); either after --warmup-steps of linear warmup")
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "steps of linear warmup from lr/warmup to --lr")
      ->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "--lr-schedule cosine: the learning rate of the last step (default: lr / 10)");
  app.add_option("--weight-decay", o.weight_decay,
                 "AdamW's decoupled weight decay, of parameters of 2 or more dimensions only")
      ->capture_default_str();
}

// Checkpoints, prefetch, memory, and what is written after training.
void add_output_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--ckpt-dir", o.ckpt_dir, "directory of checkpoints (step-N sub-directories)");
  app.add_option("--ckpt-format", o.ckpt_format,
                 "sharded (each rank writes its shards) or full (rank 0 writes model and optimizer safetensors)")
      ->capture_default_str();
  app.add_option("--ckpt-every", o.ckpt_every,
                 "save a checkpoint every K steps; with --ckpt-dir one is always saved after the last step (0: only then)");
  app.add_option("--ckpt-keep", o.ckpt_keep, "keep the newest N complete checkpoints")->capture_default_str();
  app.add_flag("--ckpt-async", o.ckpt_async,
               "save checkpoints in the background: copy the state to host memory, train on while a thread writes it");
  app.add_flag("--resume", o.resume, "continue from the newest complete checkpoint in --ckpt-dir (if any)");
  app.add_flag("--forward-prefetch", o.forward_prefetch, "issue the next unit's all-gather before this unit's forward");
  app.add_option("--backward-prefetch", o.backward_prefetch,
                 "none, pre (before this unit's gradients) or post (after them): when backward gathers the next unit")
      ->capture_default_str();
  app.add_option("--prefetch-depth", o.prefetch_depth, "units ahead that prefetch gathers")->capture_default_str();
  app.add_flag("--no-limit-all-gathers", o.no_limit_all_gathers,
               "let prefetch keep more than one unused unit gathered (off: at most one)");
  app.add_flag("--no-block-cache", o.no_block_cache,
               "give every freed host buffer back at once instead of keeping six unit buffers' worth for reuse");
  app.add_option("--plot", o.plot,
                 "write DIR/loss.png and DIR/memory.png from the log after training (the log defaults to DIR/log.jsonl)");
  app.add_option("--sample", o.sample, "after training, print N tokens the model generates from --prompt (0: none)");
  app.add_option("--temperature", o.temperature, "--sample: softmax temperature (0: greedy)")->capture_default_str();
  app.add_option("--prompt", o.prompt, "--sample: the text generation starts from")->capture_default_str();
  app.add_option("--sample-seed", o.sample_seed, "--sample: seed of the sampling")->capture_default_str();
  app.add_option("--chat-template", o.chat_template,
                 "--sample: a model folder (its chat template, as transformers finds it) or a Jinja file: --prompt "
                 "is a user's message, rendered with the template's generation prompt; the answer alone is "
                 "printed, up to the token that ends an answer (needs --tokenizer)");
  app.add_option("--trace", o.trace,
                 "write a Chrome/Perfetto trace per rank: FILE.json becomes FILE.rank<r>.json");
  app.add_option("--summary", o.summary,
                 "write the run's figures as one JSON object (medians after the first step; per-rank lists)");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "seconds a collective may wait before the job is ended (default: FSDP_COLLECTIVE_TIMEOUT, else 600)");
}

}  // namespace

void add_options(CLI::App& app, TrainOptions& o) {
  add_model_options(app, o);
  add_offload_options(app, o);
  add_data_options(app, o);
  add_parallel_options(app, o);
  fsdp_tools::add_zero_plus_plus_flags(app, o);
  fsdp_tools::add_run_flags(app, o);
  add_output_options(app, o);
}

}  // namespace fsdp_train
