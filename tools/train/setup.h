#pragma once
// fsdp-train's set-up: the options checked and turned into the library's
// option structs, the data and the model built, before the first collective
// of training, so that bad input fails on every rank alike.

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_manager.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/model_config.h"
#include "fsdp/lr_schedule.h"
#include "fsdp/run_plan.h"
#include "fsdp/token_data.h"
#include "fsdp/chat_template.h"
#include "fsdp/tokenizer.h"
#include "train/options.h"

namespace fsdp_train {

// Everything a run needs, built and checked.
struct Run {
  // --model's configuration: the shape options over the preset, a
  // tokenizer's vocabulary, or --init-from's config.json.
  fsdp::models::ModelConfig model_config;
  std::unique_ptr<fsdp::models::TokenData> data;  // --data of tokens (null for conversations)
  // --data of conversations (fsdp-data encode-chat's files; null for tokens).
  std::unique_ptr<fsdp::models::ConversationData> conversations;
  std::shared_ptr<const fsdp::text::Tokenizer> tokenizer;  // --tokenizer (null: none)
  std::shared_ptr<const fsdp::text::ChatTemplate> chat_template;  // --chat-template (null: none)
  std::shared_ptr<fsdp::models::LanguageModel> model;  // --model: a GPT or a Llama
  fsdp::FullyShardOptions fsdp_options;
  std::string strategy_reason;  // why --strategy auto picked what it did
  fsdp::CheckpointFormat ckpt_format = fsdp::CheckpointFormat::kSharded;
  double init_seconds = 0.0;     // reading --init-from
  int64_t init_peak_rss = 0;     // this rank's peak resident set once --init-from is read
  fsdp::LrSchedule schedule;     // --lr-schedule, --warmup-steps, --min-lr over --steps
  // The sharded model, held here too: an error in training reaches main's
  // handler, which ends the job, with the model's process groups alive.
  // Destroying a group whose collective is stuck (the watchdog's case)
  // would wait for it forever.
  std::shared_ptr<void> sharded_model;
  std::unique_ptr<fsdp::CheckpointFolderLock> ckpt_lock;  // rank 0's, on --ckpt-dir for the whole run
  std::ofstream log;
  c10::Device device = c10::Device(torch::kCPU);  // --device: where the units compute
  std::string backend = "mpi";                   // --backend, resolved
  int64_t ram_predicted = 0;                     // the preflight's host memory per rank (0: not checked)
  int64_t ram_predicted_deepest = 0;             // ... with the disk offload's read-ahead at its deepest
  int64_t ram_predicted_all_ranks = 0;           // ... the ranks together (HostMemoryNeed::all_ranks)
  fsdp::ProcessGroupPtr group;                   // what the model is sharded over (world, or NCCL over it)
  // What the inputs hold that reads but the user should hear of (a
  // tokenizer's shared ids, config.json's ignored dropout): rank 0 prints
  // them at the end of prepare.
  std::vector<std::string> warnings;
  int64_t trainable_params = 0;  // the parameters left trainable by --freeze (all without it)
  // What the planner plans (the preflight, --strategy auto, the prediction):
  // the config's description, with --freeze or LoRA the units' trainable and
  // frozen elements (fsdp_tools::plan_description).
  fsdp::ModelDescription plan_description;
  fsdp_tools::FineTuned fine_tuned;  // what --freeze or LoRA did
};

// Checks the options and builds the run (collective only with --device cuda).
Run prepare(const TrainOptions& o, const fsdp::ProcessGroupPtr& world);

// LibTorch threads per rank without --threads: FSDP_THREADS_PER_RANK or
// OMP_NUM_THREADS, else the cores shared among the ranks.
int default_threads(int world);

// The built-in corpus (data/default_corpus.txt of the checkout this was built
// in): what the trainer reads when no --data is given.
const char* default_corpus_path();

// The run's settings for its plan (fsdp::plan_run), beside fully_shard's
// options: the world and its hosts, accumulation, clipping and loss scaling,
// the asynchronous checkpoints; `gathers_run_ahead` as the sharded state says.
fsdp::RunSettings run_settings(const TrainOptions& o, const Run& run, int world, int ranks_per_node,
                               bool gathers_run_ahead);

// --trace FILE.json: rank r writes FILE.rank<r>.json.
std::string trace_path(const std::string& path, int rank);

}  // namespace fsdp_train
