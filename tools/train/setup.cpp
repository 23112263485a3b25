// fsdp-train's set-up: options to the library's option structs, the
// preflight, the data, the model, the device.

#include "train/setup.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include "core/preemption_test_hook.h"
#include "fsdp/device_choice.h"
#include "fsdp/error.h"
#include "plan/host_memory.h"
#include "base/strings.h"
#include "core/host_resources.h"
#include "fsdp/memory.h"
#include "fsdp/hugging_face.h"
#include "plan/estimates.h"
#include "fsdp/state_dict.h"
#include "fsdp/train_step.h"
#include "fsdp/wrap_policy.h"
#include "train/text.h"
#include "state_dict/hugging_face_files.h"
#include "core/cpu_features.h"
#include "core/loss_scaling.h"

namespace fsdp_train {
namespace {

int ranks_per_node(const TrainOptions& o) {
  if (o.ranks_per_node > 0) return o.ranks_per_node;
  const char* env = std::getenv("FSDP_RANKS_PER_NODE");  // set by fsdp-run --ranks-per-node
  return env ? std::atoi(env) : 0;
}

// --wrap: a unit per transformer block (decoder layer), or one per attention
// and per MLP (half the largest gathered buffer, twice the collectives).
fsdp::WrapPolicy make_wrap_policy(const fsdp::models::ModelConfig& model, const std::string& wrap) {
  TORCH_CHECK(wrap == "block" || wrap == "sublayer", "--wrap must be block or sublayer, got '", wrap, "'");
  return model.wrap_policy(wrap == "sublayer");
}

// --init-from a config.json alone: the shape, no weights.
bool shape_only(const std::string& init_from) {
  return init_from.size() > 5 && init_from.compare(init_from.size() - 5, 5, ".json") == 0 &&
         !std::filesystem::is_directory(init_from);
}

bool uses_nvme(const TrainOptions& o) { return o.offload_optimizer == "nvme" || o.offload_params == "nvme"; }

// --offload-optimizer nvme, --offload-params nvme: the disk offload's options.
void set_nvme_offload(const TrainOptions& o, fsdp::FullyShardOptions& options) {
  for (const std::string* value : {&o.offload_optimizer, &o.offload_params}) {
    TORCH_CHECK(*value == "none" || *value == "nvme", "--offload-optimizer and --offload-params must be none or nvme, got '",
                *value, "'");
  }
  if (!uses_nvme(o)) {
    TORCH_CHECK(o.offload_dir.empty(), "--offload-dir needs --offload-optimizer nvme or --offload-params nvme");
    return;
  }
  TORCH_CHECK(!o.offload_dir.empty(), "--offload-optimizer nvme and --offload-params nvme need --offload-dir DIR ",
              "(a folder on a disk with room for the offloaded state; fsdp-plan --offload nvme says how much)");
  TORCH_CHECK(std::filesystem::is_directory(o.offload_dir), "--offload-dir: '", o.offload_dir, "' is not a folder");
  TORCH_CHECK(o.offload == "none", "--offload cpu is for a GPU run; it cannot be combined with nvme offload");
  TORCH_CHECK(o.adamw == "fused", "nvme offload steps with fsdp::FusedAdamW: --adamw torch cannot be combined with it");
  options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions(o.offload_dir)
                           .optimizer_state(o.offload_optimizer == "nvme")
                           .params(o.offload_params == "nvme")
                           .read_ahead(o.offload_read_ahead)
                           .max_read_ahead(std::max(o.offload_read_ahead, o.offload_read_ahead_max))
                           .step_in_backward(!o.offload_step_after_backward)
                           // Room for the gradients only where a step needs to write them out.
                           .gradient_slots(o.clip_grad_norm > 0 ||
                                           fsdp::scales_loss(fsdp::TrainStepOptions(), options.mixed_precision()))
                           .store(fsdp::offload::DiskStoreOptions(o.offload_dir)
                                      .engine(fsdp::parse_enum<fsdp::offload::IoEngine>(o.offload_engine)))));
}

fsdp::FullyShardOptions make_fsdp_options(const TrainOptions& o, const Run& run) {
  const fsdp::MixedPrecision mp = fsdp_tools::mixed_precision(o, o);
  auto options = fsdp::FullyShardOptions()
                     .wrap_policy(make_wrap_policy(run.model_config, o.wrap))
                     .mixed_precision(mp)
                     .ranks_per_node(ranks_per_node(o))
                     .forward_prefetch(o.forward_prefetch)
                     .backward_prefetch(fsdp::parse_enum<fsdp::BackwardPrefetch>(o.backward_prefetch))
                     .prefetch_depth(o.prefetch_depth)
                     .limit_all_gathers(!o.no_limit_all_gathers)
                     .cache_host_blocks(!o.no_block_cache)
                     .activation_checkpointing(o.activation_checkpointing)
                     .zero_plus_plus(o.zero_plus_plus());
  TORCH_CHECK(o.prefetch_depth >= 1, "--prefetch-depth must be at least 1, got ", o.prefetch_depth);
  if (o.strategy != "auto") options.strategy(fsdp::parse_enum<fsdp::ShardingStrategy>(o.strategy));
  set_nvme_offload(o, options);
  return options;
}

// --strategy auto: fsdp::choose_strategy's rule, the one fsdp-plan --budget
// applies too (model state plus gathered parameters, least communication first).
fsdp::ShardingStrategy pick_strategy(const TrainOptions& o, Run& run, int world) {
  TORCH_CHECK(o.memory_budget > 0,
              "--strategy auto needs --memory-budget BYTES (per-rank model state plus gathered parameters)");
  const bool sublayer = o.wrap == "sublayer";
  const fsdp::StrategyChoice choice =
      fsdp::choose_strategy(run.plan_description.units(sublayer), world, run.fsdp_options.ranks_per_node(),
                            run.fsdp_options.mixed_precision(), o.memory_budget, run.plan_description.frozen(sublayer),
                            run.plan_description.nf4(sublayer));
  run.strategy_reason = choice.reason;
  return choice.strategy;
}

// The preflight (fsdp/host_memory.h) of this run on the CPU: a GPU run's
// host memory is not the step's peak. Before the model is built: its
// description (run.plan_description) is what the plan needs.
void preflight(const TrainOptions& o, Run& run, int world) {
  if (o.no_preflight || o.device != "cpu") return;
  // The run as fully_shard will take it: the same options.
  fsdp::PlannedRun plan{run.plan_description, run.fsdp_options,
                        run_settings(o, run, world, run.fsdp_options.ranks_per_node(), false)};
  if (o.strategy == "auto") plan.options.strategy(fsdp::ShardingStrategy::kFullShard);
  plan.settings.ranks_here = fsdp::ranks_on_this_host(world);
  const int64_t available = fsdp::host_memory_available();
  // The disk offload reads ahead as deep as asked where the host has room,
  // and shallower, saying so, where only that fits.
  const int read_ahead = fsdp::fitting_read_ahead(plan, available);
  if (read_ahead > 0 && read_ahead != o.offload_read_ahead) {
    run.warnings.push_back("preflight: --offload-read-ahead " + std::to_string(o.offload_read_ahead) +
                           " does not fit this host's " + fsdp::format_mib(available) + " available; reading " +
                           std::to_string(read_ahead) + " unit(s) ahead instead");
    const auto shallower =
        fsdp::NvmeOffloadOptions(*run.fsdp_options.offload().nvme_options()).read_ahead(read_ahead).max_read_ahead(read_ahead);
    run.fsdp_options.offload(fsdp::OffloadPolicy::nvme(shallower));
    plan.options.offload(fsdp::OffloadPolicy::nvme(shallower));
  }
  const fsdp::HostMemoryNeed need = fsdp::preflight_host_memory(plan, available);
  if (uses_nvme(o)) fsdp::preflight_scratch_space(plan, fsdp::scratch_space_available(o.offload_dir, world));
  run.ram_predicted = need.per_rank;
  run.ram_predicted_all_ranks = need.all_ranks;
  run.ram_predicted_deepest = run.ram_predicted;
  if (read_ahead == 0 || run.fsdp_options.offload().nvme_options()->max_read_ahead() <= read_ahead) return;
  // It deepens, where compute waits on the disk, as far as the host has room for.
  const fsdp::NvmeOffloadOptions asked = *run.fsdp_options.offload().nvme_options();  // a copy: run's options change below
  fsdp::PlannedRun deepest = plan;
  deepest.options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions(asked).read_ahead(asked.max_read_ahead())));
  const int deepest_fitting = fsdp::fitting_read_ahead(deepest, available);
  run.fsdp_options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions(asked).max_read_ahead(deepest_fitting)));
  deepest.options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions(asked).read_ahead(deepest_fitting)));
  run.ram_predicted_deepest = fsdp::host_memory_needed(deepest);
}

// What a LoRA run writes: its adapters (--save-format peft), the merged
// model (hf with --merge-lora), or all its parameters under our names (spec).
void check_lora_outputs(const TrainOptions& o) {
  TORCH_CHECK(o.save_format != "peft" || o.lora(),
              "--save-format peft writes LoRA adapters: it needs --lora-rank or --init-from-adapter");
  TORCH_CHECK(!o.merge_lora || (o.lora() && o.save_format == "hf"),
              "--merge-lora needs LoRA (--lora-rank or --init-from-adapter) and --save-format hf");
  TORCH_CHECK(o.save_format != "hf" || !o.lora() || o.merge_lora,
              "--save-format hf of a LoRA run: transformers' from_pretrained would not know the adapters; pass "
              "--merge-lora (the adapters merged into the weights) or use --save-format peft (the adapters alone)");
}

// The options that are single numbers or names, checked before anything is built.
void check_values(const TrainOptions& o, int world) {
  // inf passes the comparisons below, and trains to a NaN loss; nan fails them with a misleading message.
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--lr", o.lr}, {"--min-lr", o.min_lr.value_or(0)},
                                    {"--clip-grad-norm", o.clip_grad_norm}, {"--weight-decay", o.weight_decay},
                                    {"--temperature", o.temperature}, {"--val-fraction", o.val_fraction},
                                    {"--collective-timeout", o.collective_timeout}}) {
    TORCH_CHECK(std::isfinite(value), flag, " must be a finite number, got ", value);
  }
  // Counts whose 0 means "the default": a negative one was silently the default.
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--threads", o.threads},
                                    {"--print-every", o.print_every}, {"--warmup-steps", o.warmup_steps},
                                    {"--ranks-per-node", o.ranks_per_node}, {"--memory-budget", o.memory_budget},
                                    {"--offload-read-ahead", o.offload_read_ahead},
                                    {"--offload-read-ahead-max", o.offload_read_ahead_max}}) {
    TORCH_CHECK(value >= 0, flag, " must be >= 0, got ", value);
  }
  TORCH_CHECK(o.collective_timeout >= 0, "--collective-timeout must be >= 0 (0: the default), got ", o.collective_timeout);
  fsdp_tools::check_model_flags(o);
  TORCH_CHECK(o.steps >= 0, "--steps must be >= 0, got ", o.steps);
  TORCH_CHECK(o.steps > 0 || (!o.save_final.empty() && !o.resume),
              "--steps 0 trains nothing: it writes the model as loaded (--init-from, --init-from-adapter) to "
              "--save-final, which it needs (and --resume is for training on)");
  TORCH_CHECK(o.lr > 0, "--lr must be positive, got ", o.lr);
  TORCH_CHECK(o.grad_accum > 0, "--grad-accum must be positive, got ", o.grad_accum);
  TORCH_CHECK(o.sample >= 0 && o.temperature >= 0, "--sample and --temperature must be >= 0");
  TORCH_CHECK(o.clip_grad_norm >= 0, "--clip-grad-norm must be positive, got ", o.clip_grad_norm);
  TORCH_CHECK(o.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.weight_decay);
  TORCH_CHECK(o.adamw == "fused" || o.adamw == "torch", "--adamw must be fused or torch, got '", o.adamw, "'");
  TORCH_CHECK(o.lr_schedule == "cosine" || !o.min_lr, "--min-lr needs --lr-schedule cosine");
  TORCH_CHECK(o.ckpt_every >= 0 && o.ckpt_keep >= 1, "--ckpt-every must be >= 0 and --ckpt-keep >= 1");
  TORCH_CHECK(!o.ckpt_dir.empty() || (o.ckpt_every == 0 && !o.resume && !o.ckpt_async),
              "--ckpt-every, --ckpt-async and --resume need --ckpt-dir");
  TORCH_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1), got ", o.val_fraction);
  TORCH_CHECK(o.eval_every >= 0, "--eval-every must be >= 0, got ", o.eval_every);
  TORCH_CHECK(o.eval_every == 0 || o.val_fraction > 0, "--eval-every ", o.eval_every,
              " needs a validation split, but --val-fraction is 0");
  // Each rank evaluates E / W sequences, so that every rank runs the same
  // number of forwards (their all-gathers): E must split evenly.
  TORCH_CHECK(!o.eval_sequences || (*o.eval_sequences > 0 && *o.eval_sequences % world == 0),
              "--eval-sequences must be a positive multiple of the world size ", world, ", got ",
              o.eval_sequences.value_or(0));
  TORCH_CHECK(!o.sharded_init || o.init_from.empty() || shape_only(o.init_from),
              "--sharded-init draws the initial weights unit by unit; it cannot be combined with --init-from a model "
              "(--init-from a config.json alone gives the shape, and can)");
  if (o.save_dtype != "source") {
    try {
      fsdp::parse_enum<torch::ScalarType>(o.save_dtype);
    } catch (const c10::Error&) {
      TORCH_CHECK(false, "--save-dtype must be source, fp32, bf16 or fp16, got '", o.save_dtype, "'");
    }
  }
  try {
    fsdp::hugging_face::parse_size(o.hf_shard_size);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--hf-shard-size: ", fsdp::error_message(e));
  }
  check_lora_outputs(o);
  TORCH_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '", o.device, "'");
  TORCH_CHECK(o.backend == "auto" || o.backend == "mpi" || o.backend == "nccl",
              "--backend must be auto, mpi or nccl, got '", o.backend, "'");
  TORCH_CHECK(o.offload == "none" || o.offload == "cpu", "--offload must be none or cpu, got '", o.offload, "'",
              o.offload == "nvme" ? " (offload to disk: --offload-optimizer nvme, --offload-params nvme)" : "");
  TORCH_CHECK(o.device == "cuda" || o.backend != "nccl", "--backend nccl needs --device cuda");
  TORCH_CHECK(o.base_dtype == "fp32" || (o.offload == "none" && o.offload_optimizer != "nvme" && o.offload_params != "nvme"),
              "--base-dtype ", o.base_dtype, " with --offload cpu, --offload-optimizer nvme or --offload-params nvme is "
              "not supported: the offloads hold float32 shards (leave --base-dtype out: the base is then offloaded in fp32)");
}

fsdp::LrSchedule make_schedule(const TrainOptions& o) {
  auto schedule = fsdp::LrSchedule()
                      .kind(fsdp::parse_enum<fsdp::LrScheduleKind>(o.lr_schedule))
                      .lr(o.lr)
                      .warmup_steps(o.warmup_steps)
                      .min_lr(o.min_lr.value_or(o.lr / 10))
                      .total_steps(o.steps);
  schedule.validate();
  return schedule;
}

void make_data(const TrainOptions& o, Run& run) {
  std::string data_path = o.data.empty() ? std::string(default_corpus_path()) : o.data;
  TORCH_CHECK(!o.data.empty() || std::ifstream(data_path).good(), "the built-in default corpus '", data_path,
              "' is missing: run scripts/setup.sh, or pass --data FILE");
  const fsdp::TransformerShape shape = run.model_config.shape();
  const auto order = fsdp::parse_enum<fsdp::models::DataOrder>(o.data_order);
  if (fsdp::models::ConversationData::has_conversations(data_path)) {
    run.conversations = std::make_unique<fsdp::models::ConversationData>(
        data_path, shape.context, shape.vocab,
        fsdp::models::ConversationDataOptions().order(order).seed(o.data_seed).val_fraction(o.val_fraction).pack(
            o.pack));
    return;
  }
  run.data = std::make_unique<fsdp::models::TokenData>(
      data_path, shape.context, shape.vocab,
      fsdp::models::TokenDataOptions().order(order).seed(o.data_seed).val_fraction(o.val_fraction));
}

// --init-from a Hugging Face model: its config.json gives the model
// (fsdp_tools::init_from_config); --init-from a config.json alone: the
// shape, initialized as the model's own init does (a hub shape tried
// without its weights).
void apply_hugging_face_config(const TrainOptions& o, Run& run) {
  if (shape_only(o.init_from)) {
    run.model_config = fsdp_tools::init_from_config(o, o.init_from, run.model_config, run.warnings);
    return;
  }
  // A folder is a Hugging Face model or nothing: find_model names what it
  // lacks (config.json, which an export writes last, so a half-written one).
  const bool folder = !o.init_from.empty() && std::filesystem::is_directory(o.init_from);
  if (!folder && !fsdp::hugging_face::is_model(o.init_from)) return;
  fsdp::hugging_face::ModelFiles files;
  try {
    files = fsdp::hugging_face::find_model(o.init_from);
  } catch (const c10::Error& e) {
    if (!folder) throw;
    TORCH_CHECK(false, "--init-from: ", fsdp::error_message(e));
  }
  run.model_config = fsdp_tools::init_from_config(o, files.config, run.model_config, run.warnings);
  // config.json against the files' tensors, before the model is built or planned.
  fsdp::hugging_face::check_weights(files, run.model_config);
}

// The whole model on every rank (initialized), or its shapes only for
// --sharded-init and for a Hugging Face --init-from, whose weights each rank
// reads into its own shards once the model is sharded (load_init_from); or a
// weight file of ours read whole on every rank.
void make_model(const TrainOptions& o, Run& run) {
  fsdp::memory::reset_peaks();
  if (o.sharded_init || fsdp::hugging_face::is_model(o.init_from)) {
    fsdp::memory::DeferredInit deferred;  // shapes only: fully_shard initializes unit by unit
    run.model = run.model_config.new_model();
  } else {
    run.model = run.model_config.new_model();
    run.model->init_weights(o.seed);
  }
  if (!o.init_from.empty() && !fsdp::hugging_face::is_model(o.init_from) && !shape_only(o.init_from)) {
    const auto start = std::chrono::steady_clock::now();
    fsdp::load_full_weights(*run.model, o.init_from);
    run.init_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    run.init_peak_rss = fsdp_tools::peak_rss_bytes();
  }
}

// --freeze or LoRA (fsdp_tools::apply_fine_tuning), before fully_shard
// (with disk offload refused by check_values).
void freeze_parameters(const TrainOptions& o, Run& run) {
  const fsdp_tools::FineTuned done = fsdp_tools::apply_fine_tuning(o, *run.model, o.seed);
  run.trainable_params = done.trainable;
  run.fine_tuned = done;
}

// --device, --backend (fsdp/device_choice.h), named in its errors.
void choose_device(const TrainOptions& o, const fsdp::ProcessGroupPtr& world, Run& run) {
  const auto backend = o.backend == "nccl" ? fsdp::CollectiveBackend::kNccl
                       : o.backend == "mpi" ? fsdp::CollectiveBackend::kMpi
                                            : fsdp::CollectiveBackend::kAuto;
  fsdp::DeviceChoice choice;
  try {
    choice = fsdp::choose_device(o.device == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU, backend, world);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--device ", o.device, ": ", fsdp::error_message(e));
  }
  run.device = choice.device;
  run.backend = choice.backend;
  run.group = choice.group;
  if (o.device == "cuda") run.fsdp_options.device(run.device);
}

// --trace's folder, --plot's gnuplot and folder, rank 0's --log.
// A file the run writes after training: its directory must be there now,
// so that no training is lost to a mistyped path at the end.
void check_output_directory(const char* flag, const std::string& path) {
  if (path.empty()) return;
  const auto dir = std::filesystem::path(path).parent_path();
  if (dir.empty() || std::filesystem::is_directory(dir)) return;
  TORCH_CHECK(!std::filesystem::exists(dir), flag, ": '", dir.string(), "' is not a directory");
  TORCH_CHECK(false, flag, ": the directory '", dir.string(), "' does not exist");
}

void prepare_outputs(const TrainOptions& o, Run& run, int rank) {
  if (!o.trace.empty()) check_output_directory("--trace", trace_path(o.trace, rank));
  check_output_directory("--summary", o.summary);
  check_output_directory("--save-final", o.save_final);
  if (!o.plot.empty()) {
    TORCH_CHECK(std::system("command -v gnuplot > /dev/null 2>&1") == 0,
                "--plot needs gnuplot (Debian: apt-get install gnuplot-nox)");
    if (rank == 0) std::filesystem::create_directories(o.plot);  // rank 0's plots (and a preemption's removal: no other rank re-creates it)
  }
  if (rank == 0 && !o.log.empty()) {
    run.log.open(o.log, o.resume ? std::ios::app : std::ios::trunc);
    TORCH_CHECK(run.log, "cannot open the log file '", o.log, "' for writing");
  }
}

// --ckpt-dir is this job's alone, from before anything is loaded (two jobs
// in one folder rotated away each other's checkpoints, and one died on the
// other's half-made files): rank 0 holds its lock for the whole run.
void lock_checkpoint_folder(const TrainOptions& o, Run& run, int rank) {
  if (o.ckpt_dir.empty() || rank != 0) return;
  try {
    run.ckpt_lock = std::make_unique<fsdp::CheckpointFolderLock>(o.ckpt_dir);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--ckpt-dir: ", fsdp::error_message(e));
  }
}

// bf16 compute (the parameters, or a frozen base) on a CPU without bf16 instructions.
void warn_of_cpu_bf16(Run& run) {
  const fsdp::MixedPrecision& mp = run.fsdp_options.mixed_precision();
  if (!run.device.is_cpu() ||
      (mp.param_dtype() != torch::kBFloat16 && mp.effective_frozen_param_dtype() != torch::kBFloat16)) {
    return;
  }
  const std::string warning = fsdp::cpu_bf16_warning();
  if (!warning.empty()) run.warnings.push_back(warning);
}

}  // namespace

int default_threads(int world) {
  for (const char* var : {"FSDP_THREADS_PER_RANK", "OMP_NUM_THREADS"}) {
    if (const char* value = std::getenv(var)) {
      int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world);
}

fsdp::RunSettings run_settings(const TrainOptions& o, const Run& run, int world, int ranks_per_node,
                               bool gathers_run_ahead) {
  fsdp::RunSettings settings;
  settings.world = world;
  settings.ranks_per_node = ranks_per_node;
  settings.micro_steps = o.grad_accum;
  settings.clips_gradients = o.clip_grad_norm > 0;
  settings.scales_loss = fsdp::scales_loss(fsdp::TrainStepOptions(), run.fsdp_options.mixed_precision());
  settings.gathers_run_ahead = gathers_run_ahead;
  settings.async_checkpoint = o.ckpt_async && !o.ckpt_dir.empty();
  settings.full_checkpoint = o.ckpt_format == "full";
  settings.sublayer_units = o.wrap == "sublayer";
  settings.sharded_init = o.sharded_init;
  return settings;
}

std::string trace_path(const std::string& path, int rank) {
  const std::string suffix = ".json";
  const bool json = path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (json ? path.substr(0, path.size() - suffix.size()) : path) + ".rank" + std::to_string(rank) + suffix;
}

Run prepare(const TrainOptions& o, const fsdp::ProcessGroupPtr& world) {
  Run run;
  fsdp::models::GPTConfig shape = fsdp_tools::gpt_config(o);
  apply_tokenizer(o, run);
  apply_chat_template(o, run);
  if (run.tokenizer && !o.vocab) shape.vocab = run.tokenizer->vocab_size();
  check_values(o, world->size());
  lock_checkpoint_folder(o, run, world->rank());
  run.model_config = fsdp_tools::model_config(o, shape);
  apply_hugging_face_config(o, run);
  check_tokenizer_fits(o, run);
  run.schedule = make_schedule(o);
  run.ckpt_format = fsdp::parse_enum<fsdp::CheckpointFormat>(o.ckpt_format);
  run.fsdp_options = make_fsdp_options(o, run);
  // Before anything is allocated: a bad --freeze or LoRA flag is refused here.
  run.plan_description = fsdp_tools::plan_description(o, run.model_config);
  preflight(o, run, world->size());
  make_data(o, run);
  // Flags that would change nothing are refused rather than ignored.
  TORCH_CHECK(o.pack || run.conversations, "--no-pack is for conversations (--data of fsdp-data encode-chat's ",
              "files); ", o.data.empty() ? std::string("the built-in corpus") : "'" + o.data + "'",
              " is a token file, read in sequences of --context tokens");
  TORCH_CHECK(o.chat_template.empty() || o.sample > 0, "--chat-template is for --sample N: the answer to --prompt ",
              "rendered with it (give --sample, or leave --chat-template out)");
  // Before the model's seed: --device cuda loads the CUDA module, which must
  // come before anything asks LibTorch about CUDA (src/comm/cuda_module.h).
  choose_device(o, world, run);
  warn_of_cpu_bf16(run);
  make_model(o, run);
  freeze_parameters(o, run);
  if (o.strategy == "auto") run.fsdp_options.strategy(pick_strategy(o, run, world->size()));
  if (o.offload == "cpu") run.fsdp_options.offload(fsdp::OffloadPolicy::cpu());  // set_nvme_offload refused it beside nvme
  prepare_outputs(o, run, world->rank());
  fsdp::detail::maybe_signal_in_setup_for_test(world->rank());
  if (world->rank() == 0) {
    for (const std::string& warning : run.warnings) std::cerr << "fsdp-train: warning: " << warning << "\n";
  }
  return run;
}

}  // namespace fsdp_train
