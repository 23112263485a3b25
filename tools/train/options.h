#pragma once
// fsdp-train's configuration: every command-line option, and their binding.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/options.h"
#include "shared_flags.h"

namespace fsdp_train {

// The command line as given (validated by prepare(), setup.h).
// The model's flags (--model, --preset, the shape, --kv-heads), ZeRO++'s and
// the run's settings (RunFlags) are the ones fsdp-plan takes too (shared_flags.h).
struct TrainOptions : fsdp_tools::ModelFlags, fsdp_tools::ZeroPlusPlusFlags, fsdp_tools::RunFlags,
                      fsdp_tools::FineTuneFlags {
  TrainOptions() { preset = fsdp_tools::kTrainerPreset; }
  int64_t steps = 100;
  double lr = 1e-3;
  uint64_t seed = 1337;
  std::string data;
  std::string data_order = "shuffled";
  uint64_t data_seed = 0;
  double val_fraction = 0.1;
  bool pack = true;  // --data of conversations: several a row (else one a row, padded)
  int64_t eval_every = 0;
  std::optional<int64_t> eval_sequences;
  std::string save_final;
  std::string save_format = "spec";  // --save-final as the spec's file, or a Hugging Face folder (hf)
  std::string save_dtype = "source";  // --save-format hf: the weights' dtype (source: --init-from's, else fp32)
  std::string hf_shard_size = "5GB";  // --save-format hf: the largest weight file
  bool merge_lora = false;  // --save-format hf of a LoRA run: the adapters merged into the base weights
  std::string log;
  int threads = 0;
  int64_t print_every = 0;
  std::string strategy = "full_shard";
  int ranks_per_node = 0;
  int64_t memory_budget = 0;
  int64_t grad_accum = 1;
  bool no_sync = false;
  std::string lr_schedule = "constant";  // the spec's default: constant unless a schedule is asked for
  int64_t warmup_steps = 0;
  std::optional<double> min_lr;  // default: lr / 10 (nanoGPT's)
  double weight_decay = 0.0;
  std::string adamw = "fused";
  std::string device = "cpu";
  std::string backend = "auto";
  std::string offload = "none";
  std::string offload_optimizer = "none", offload_params = "none", offload_dir, offload_engine = "auto";
  int offload_read_ahead_max = 4;  // the deepest the read-ahead grows where compute waits on the disk
  bool no_preflight = false;
  double collective_timeout = 0.0;
  std::string ckpt_dir;
  int64_t ckpt_every = 0;
  int ckpt_keep = 2;
  std::string ckpt_format = "sharded";
  bool ckpt_async = false;  // stage, then write in the background (CheckpointManagerOptions::async)
  bool resume = false;
  bool forward_prefetch = false;
  std::string backward_prefetch = "pre";
  int prefetch_depth = 1;
  bool no_limit_all_gathers = false;
  bool no_block_cache = false;
  std::string trace;
  std::string summary;
  std::string plot;
  int64_t sample = 0;
  double temperature = 0.8;
  std::string prompt = "The ";
  std::string chat_template;  // --chat-template: --prompt is a user's message, rendered with it
  std::string tokenizer;  // a Hugging Face tokenizer.json (fsdp-data train-tokenizer writes one)
  uint64_t sample_seed = 0;
};

// Registers every option of `o` with `app`.
void add_options(CLI::App& app, TrainOptions& o);

}  // namespace fsdp_train
