// The flags fsdp-train and fsdp-plan share, bound once: the model's
// (--model, --preset, the shape's overrides, --kv-heads, --init-from) and ZeRO++'s, with
// the model configs and options they make, so that the two tools plan one
// run alike. Header only (both tools include LibTorch already).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/hugging_face.h"
#include "fsdp/model_config.h"
#include "fsdp/lora.h"
#include "fsdp/memory.h"
#include "fsdp/peft.h"
#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"
#include "fsdp/run_plan.h"
#include "text/pretokenizer.h"
#include "tool_support.h"
#include "models/attention_kernel.h"
#include "core/unit_plan.h"

namespace fsdp_tools {

// fsdp-train's --preset when none is given (and so its batch with --init-from).
inline constexpr const char* kTrainerPreset = "small";

// The command line's model, as given.
struct ModelFlags {
  std::string model = "gpt";  // gpt or llama
  std::string preset;         // tiny, small, medium, large, xl or 3b
  std::optional<int64_t> vocab, context, layers, heads, width, batch;
  std::optional<int64_t> kv_heads;  // --model llama
  // A model to start from: for both tools a Hugging Face model gives the
  // shape (its config.json: init_from_config); fsdp-train also reads its
  // weights, or a .safetensors file of ours.
  std::string init_from;
  std::string attention = "auto";  // auto, sdpa or written (fsdp/attention.h)

  // --attention (kAuto kept: the banner says why it resolved as it did);
  // throws naming the flag for a name it does not know, or a kernel this
  // LibTorch does not have.
  fsdp::AttentionKernel attention_kernel() const {
    try {
      const fsdp::AttentionKernel kernel = fsdp::parse_enum<fsdp::AttentionKernel>(attention);
      fsdp::resolve_attention(kernel);
      return kernel;
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "--attention: ", e.what_without_backtrace());
    }
  }

  // --model's family; throws naming the flag and the names it takes.
  fsdp::models::ModelKind kind() const {
    try {
      return fsdp::parse_enum<fsdp::models::ModelKind>(model);
    } catch (const c10::Error&) {
      TORCH_CHECK(false, "--model must be gpt or llama, got '", model, "'");
    }
  }
};

// Binds the flags; `preset_help` says what the tool does without --preset,
// `init_from_help` what it reads of --init-from.
inline void add_model_flags(CLI::App& app, ModelFlags& f, const std::string& preset_help,
                            const std::string& init_from_help) {
  app.add_option("--model", f.model,
                 "gpt (the reference GPT, fsdp/gpt.h) or llama (Hugging Face's LlamaForCausalLM, fsdp/llama.h)")
      ->capture_default_str();
  CLI::Option* preset = app.add_option("--preset", f.preset, "tiny, small, medium, large, xl or 3b" + preset_help);
  if (!f.preset.empty()) preset->capture_default_str();
  app.add_option("--vocab", f.vocab, "override the preset's vocabulary size")->check(positive());
  app.add_option("--context", f.context, "override the preset's context length")->check(positive());
  app.add_option("--layers", f.layers, "override the preset's number of layers (blocks, one unit each)")
      ->check(positive());
  app.add_option("--heads", f.heads, "override the preset's number of heads")->check(positive());
  app.add_option("--width", f.width, "override the preset's width")->check(positive());
  app.add_option("--batch", f.batch, "sequences per rank per step (default: the preset's)")->check(positive());
  app.add_option("--kv-heads", f.kv_heads,
                 "--model llama: key-value heads, dividing --heads (default: the preset's, or --heads when that is given)")
      ->check(positive());
  app.add_option("--init-from", f.init_from, init_from_help);
  app.add_option("--attention", f.attention,
                 "auto (LibTorch's fused scaled_dot_product_attention where it has it, 2.0 and later; else written "
                 "out), sdpa, or written (q k^T, a causal mask, softmax: every layer keeps the B H T^2 probabilities)")
      ->capture_default_str();
}

// Refuses a model kind the tools do not know, and --kv-heads without a Llama.
inline void check_model_flags(const ModelFlags& f) {
  TORCH_CHECK(f.kind() == fsdp::models::ModelKind::kLlama || !f.kv_heads,
              "--kv-heads needs --model llama (the GPT's heads each have their own)");
  f.attention_kernel();
}

// The preset's GPT with the shape's overrides.
inline fsdp::models::GPTConfig gpt_config(const ModelFlags& f) {
  auto c = fsdp::models::GPTConfig::preset(f.preset);
  if (f.vocab) c.vocab = *f.vocab;
  if (f.context) c.context = *f.context;
  if (f.layers) c.layers = *f.layers;
  if (f.heads) c.heads = *f.heads;
  if (f.width) c.width = *f.width;
  if (f.batch) c.batch = *f.batch;
  c.validate();
  return c;
}

// --model llama: the Llama preset with `shape`'s dimensions (gpt_config's,
// or with a tokenizer's vocabulary), --kv-heads, and the SwiGLU width of an
// overridden width.
inline fsdp::models::LlamaConfig llama_config(const ModelFlags& f, const fsdp::models::GPTConfig& shape) {
  auto c = fsdp::models::LlamaConfig::preset(f.preset);
  c.vocab = shape.vocab, c.context = shape.context, c.layers = shape.layers, c.heads = shape.heads;
  c.width = shape.width, c.batch = shape.batch;
  if (f.heads) c.kv_heads = c.heads;  // plain multi-head attention unless --kv-heads says otherwise
  if (f.kv_heads) c.kv_heads = *f.kv_heads;
  if (f.width) c.hidden = fsdp::models::LlamaConfig::default_hidden(c.width);
  c.validate();
  return c;
}

// --model's configuration over `shape` (gpt_config's, or with a tokenizer's vocabulary).
inline fsdp::models::ModelConfig model_config(const ModelFlags& f, const fsdp::models::GPTConfig& shape) {
  fsdp::models::ModelConfig config = shape;
  if (f.kind() == fsdp::models::ModelKind::kLlama) config = llama_config(f, shape);
  config.set_attention(f.attention_kernel());
  return config;
}

// --init-from's config.json (at `config_path`): the model it describes, in
// place of `ours` (the flags' model), with ours' batch and, for a model with
// rotary positions, --context or else config.json's (the training sequence
// length is free: the positions are not learned). A shape flag that says
// otherwise than config.json is refused; what config.json sets that the model
// ignores (dropout) is added to `ignored`, one sentence each.
inline fsdp::models::ModelConfig init_from_config(const ModelFlags& f, const std::string& config_path,
                                                  const fsdp::models::ModelConfig& ours,
                                                  std::vector<std::string>& ignored) {
  const fsdp::hugging_face::HubConfig hub = fsdp::hugging_face::read_config(config_path);
  const fsdp::models::ModelKind kind = hub.model.kind();
  TORCH_CHECK(kind == f.kind(), "--init-from '", f.init_from, "' holds a ", fsdp::enum_name(kind),
              " model: pass --model ", fsdp::enum_name(kind));
  ignored.insert(ignored.end(), hub.ignored.begin(), hub.ignored.end());
  const fsdp::TransformerShape shape = hub.model.shape();
  auto check = [&](const char* flag, const std::optional<int64_t>& given, int64_t value) {
    TORCH_CHECK(!given || *given == value, "--", flag, " ", given.value_or(0), " contradicts --init-from '",
                f.init_from, "', whose config.json says ", value, " (leave --", flag, " out)");
  };
  check("vocab", f.vocab, shape.vocab);
  check("layers", f.layers, shape.layers);
  check("heads", f.heads, shape.heads);
  check("width", f.width, shape.width);
  const bool learned_positions = kind == fsdp::models::ModelKind::kGpt;
  if (learned_positions) check("context", f.context, shape.context);
  if (kind == fsdp::models::ModelKind::kLlama) check("kv-heads", f.kv_heads, hub.model.llama().kv_heads);
  fsdp::models::ModelConfig config = hub.model;
  config.set_batch(ours.shape().batch);
  config.set_attention(ours.attention());
  if (!learned_positions) config.set_context(f.context ? *f.context : shape.context);
  return config;
}

// The run's settings both tools take, with fsdp-train's names, defaults and
// help: precision, units, recompute, initialization, clipping, and the disk
// offload's step.
struct RunFlags {
  std::string param_dtype = "fp32";
  std::string reduce_dtype;  // "": the param dtype
  std::string wrap = "block";
  bool activation_checkpointing = false;
  bool sharded_init = false;
  double clip_grad_norm = 1.0;  // nanoGPT's default
  int offload_read_ahead = 2;   // parameter shards read ahead of their gather (units)
  bool offload_step_after_backward = false;  // the optimizer as a phase after backward, not during it
};

inline void add_run_flags(CLI::App& app, RunFlags& f) {
  app.add_option("--param-dtype", f.param_dtype, "fp32, bf16 or fp16: the dtype gathered and computed with")
      ->capture_default_str();
  app.add_option("--reduce-dtype", f.reduce_dtype, "fp32, bf16 or fp16: the dtype gradients are reduced in "
                                                   "(default: the param dtype)");
  app.add_option("--wrap", f.wrap, "block (a unit per transformer block) or sublayer (per attention and per MLP)")
      ->capture_default_str();
  app.add_flag("--activation-checkpointing", f.activation_checkpointing,
               "recompute each block's forward in backward instead of keeping its activations");
  app.add_flag("--sharded-init", f.sharded_init,
               "build the model without memory for its weights and initialize it unit by unit while sharding "
               "(the same weights as the default initialization)");
  app.add_option("--clip-grad-norm", f.clip_grad_norm, "clip the global gradient norm to this (0: off)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--offload-read-ahead", f.offload_read_ahead,
                 "nvme offload: parameter shards read ahead of their all-gather, in units (each costs one shard of memory)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_flag("--offload-step-after-backward", f.offload_step_after_backward,
               "nvme offload: step the optimizer after backward, with every gradient in memory until then, instead of "
               "each unit as soon as its gradient is reduced (what clipping and loss scaling do anyway)");
}

// ZeRO++'s quantized and hierarchical collectives (fsdp::ZeroPlusPlus), as given.
struct ZeroPlusPlusFlags {
  std::string gather_quantization = "none";    // qwZ
  bool secondary_partition = false;           // hpZ
  std::string gradient_quantization = "none";  // qgZ
  int64_t quantization_block = fsdp::ZeroPlusPlus().quantization_block();

  // The options, each value refused by its flag's name; where each applies
  // is the library's to refuse, with its reason (fully_shard, on every rank alike).
  fsdp::ZeroPlusPlus zero_plus_plus() const {
    TORCH_CHECK(quantization_block > 0, "--quantization-block must be positive, got ", quantization_block);
    auto quantization = [](const std::string& flag, const std::string& value) {
      try {
        return fsdp::parse_enum<fsdp::Quantization>(value);
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, flag, ": ", fsdp::error_message(e));
      }
    };
    return fsdp::ZeroPlusPlus()
        .gather_quantization(quantization("--gather-quantization", gather_quantization))
        .secondary_partition(secondary_partition)
        .gradient_quantization(quantization("--gradient-quantization", gradient_quantization))
        .quantization_block(quantization_block);
  }
};

inline void add_zero_plus_plus_flags(CLI::App& app, ZeroPlusPlusFlags& f) {
  app.add_option("--gather-quantization", f.gather_quantization,
                 "none, or int8: all-gather parameters as int8 blocks with a scale each, dequantized on arrival "
                 "(ZeRO++'s qwZ; sharded strategies)")
      ->capture_default_str();
  app.add_flag("--secondary-partition", f.secondary_partition,
               "keep each host's slice of a unit's parameters from forward to backward, so that backward's "
               "all-gather stays inside the host (ZeRO++'s hpZ; full_shard)");
  app.add_option("--gradient-quantization", f.gradient_quantization,
                 "none, or int8: reduce gradients inside the host, then exchange int8 blocks across hosts and sum "
                 "them in fp32 (ZeRO++'s qgZ; full_shard and shard_grad_op)")
      ->capture_default_str();
  app.add_option("--quantization-block", f.quantization_block,
                 "elements per int8 block (each with its own fp32 scale) of --gather-quantization and "
                 "--gradient-quantization")
      ->capture_default_str();
}

// What of the model trains (docs/fine-tuning.md): all of it, all but what
// --freeze names, or LoRA adapters on the --lora-targets (everything else
// frozen). Both tools apply them to the model they build, so that fsdp-plan
// counts what fsdp-train will have.
struct FineTuneFlags {
  std::string freeze;        // a regex: the parameters whose names it matches stay as they are
  bool freeze_given = false;  // --freeze on the command line (its '' is refused, not read as "none")
  int64_t lora_rank = 0;     // 0: no LoRA
  double lora_alpha = 16.0;  // the update is scaled by alpha / rank
  double lora_dropout = 0.0;
  std::vector<std::string> lora_targets{"q_proj", "k_proj", "v_proj", "o_proj"};
  std::string base_dtype = "fp32";  // bf16: the frozen base held, gathered and computed in bf16 (with LoRA); nf4: QLoRA
  // A PEFT adapter folder: its adapter_config.json gives the LoRA settings
  // (fsdp-train also loads its adapter_model.safetensors).
  std::string init_from_adapter;
  std::set<std::string> lora_flags_given;  // the --lora-* flags on the command line, to check against the folder's
  bool lora() const { return lora_rank > 0 || !init_from_adapter.empty(); }
};

inline void add_fine_tune_flags(CLI::App& app, FineTuneFlags& f) {
  app.add_option("--freeze", f.freeze,
                 "freeze the parameters whose names this regular expression matches (Oniguruma's syntax, which "
                 "takes ECMAScript's and Perl's usual forms; searched anywhere in the name, e.g. 'wte|h\\.[0-5]\\.'): "
                 "they are gathered for compute but get no gradient, no optimizer state and no weight decay "
                 "(partial fine-tuning; docs/fine-tuning.md)")
      ->each([&f](const std::string&) { f.freeze_given = true; });
  auto given = [&f](const char* flag) { return [&f, flag](const std::string&) { f.lora_flags_given.insert(flag); }; };
  app.add_option("--lora-rank", f.lora_rank,
                 "train LoRA adapters of this rank on --lora-targets and freeze everything else (0: no LoRA)")
      ->check(non_negative())
      ->each(given("--lora-rank"))
      ->capture_default_str();
  app.add_option("--lora-alpha", f.lora_alpha, "LoRA's alpha: the adapters' update is scaled by alpha / rank")
      ->check(positive())
      ->each(given("--lora-alpha"))
      ->capture_default_str();
  app.add_option("--lora-dropout", f.lora_dropout, "dropout on the adapters' input while training, in [0, 1)")
      ->check(detail::number_check("a number in [0, 1)", [](double p) { return p >= 0 && p < 1; }))
      ->each(given("--lora-dropout"))
      ->capture_default_str();
  app.add_option("--lora-targets", f.lora_targets,
                 "the linears to adapt, by name or its last part (PEFT's target_modules), comma-separated; "
                 "all-linear: every linear but the output head. The Llama's: q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj; the GPT's: c_attn, c_proj, c_fc")
      ->delimiter(',')
      ->each(given("--lora-targets"))
      ->capture_default_str();
  app.add_option("--base-dtype", f.base_dtype,
                 "with --lora-rank: fp32, or bf16 to hold the frozen base in bf16 (half its memory and gathers; "
                 "the base computes in bf16, the adapters in fp32, as PEFT with a bf16 base), or nf4: QLoRA, the "
                 "base's linear weights (but lm_head) in bitsandbytes' NF4 (0.5625 bytes a parameter, sharded and "
                 "gathered as bytes), dequantized to bf16 to compute; the other frozen parameters in bf16")
      ->check(CLI::IsMember({"fp32", "bf16", "nf4"}))
      ->capture_default_str();
  app.add_option("--init-from-adapter", f.init_from_adapter,
                 "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors): LoRA with its r, "
                 "lora_alpha, lora_dropout and target_modules, the adapters starting from its tensors (the base "
                 "model from --init-from)")
      ->check(CLI::ExistingDirectory);
}

// The LoRA settings of the flags: --init-from-adapter's adapter_config.json,
// or --lora-rank's and the others'. A --lora-* flag given beside
// --init-from-adapter must say what the folder says.
inline fsdp::lora::LoraOptions lora_options(const FineTuneFlags& f, uint64_t seed) {
  auto options = fsdp::lora::LoraOptions()
                     .rank(f.lora_rank)
                     .alpha(f.lora_alpha)
                     .dropout(f.lora_dropout)
                     .targets(f.lora_targets)
                     .seed(seed);
  if (f.init_from_adapter.empty()) return options;
  const fsdp::lora::LoraOptions folder = fsdp::peft::read_adapter_config(f.init_from_adapter).lora;
  auto check = [&](const char* flag, bool same, const auto& given, const auto& saved) {
    TORCH_CHECK(!f.lora_flags_given.count(flag) || same, flag, " ", given, " contradicts --init-from-adapter '",
                f.init_from_adapter, "', whose adapter_config.json says ", saved, " (leave ", flag, " out)");
  };
  check("--lora-rank", f.lora_rank == folder.rank(), f.lora_rank, folder.rank());
  check("--lora-alpha", f.lora_alpha == folder.alpha(), f.lora_alpha, folder.alpha());
  check("--lora-dropout", f.lora_dropout == folder.dropout(), f.lora_dropout, folder.dropout());
  check("--lora-targets", f.lora_targets == folder.targets(), c10::Join(",", f.lora_targets),
        c10::Join(",", folder.targets()));
  return options.rank(folder.rank()).alpha(folder.alpha()).dropout(folder.dropout()).targets(folder.targets());
}

// The dtypes of both tools' runs: --param-dtype, --reduce-dtype, and
// --base-dtype's frozen parameters.
inline fsdp::MixedPrecision mixed_precision(const RunFlags& run, const FineTuneFlags& fine_tune) {
  fsdp::MixedPrecision mp;
  mp.param_dtype(fsdp::parse_enum<torch::ScalarType>(run.param_dtype));
  if (!run.reduce_dtype.empty()) mp.reduce_dtype(fsdp::parse_enum<torch::ScalarType>(run.reduce_dtype));
  // (with LoRA: apply_fine_tuning)
  if (fine_tune.base_dtype == "bf16" || fine_tune.base_dtype == "nf4") mp.frozen_param_dtype(torch::kBFloat16);
  if (fine_tune.base_dtype == "nf4") mp.frozen_nf4(true);
  return mp;
}

// What apply_fine_tuning did.
struct FineTuned {
  int64_t parameters = 0;  // every parameter's elements (a tied one once)
  int64_t trainable = 0;   // those left to train
  int64_t frozen_by_pattern = 0;  // --freeze's
  std::vector<std::string> adapted;  // --lora-rank's linears
  std::optional<fsdp::lora::LoraOptions> lora;  // what LoRA was applied with
};

// The flags alone, before any model: --freeze '' (an empty pattern would
// match every name) and a LoRA setting without LoRA, which would otherwise be
// ignored and the run fine-tune every parameter.
inline void check_fine_tune_flags(const FineTuneFlags& f) {
  TORCH_CHECK(!f.freeze_given || !f.freeze.empty(),
              "--freeze '': expected a pattern naming the parameters to freeze (leave --freeze out to train them all)");
  if (f.lora()) return;
  for (const char* flag : {"--lora-alpha", "--lora-dropout", "--lora-targets"}) {
    TORCH_CHECK(!f.lora_flags_given.count(flag), flag, " needs --lora-rank R (or --init-from-adapter): without it no "
                "adapter is added and every parameter would train");
  }
}

// --freeze's pattern (nullptr for none), compiled with a bound on its
// backtracking: a parameter name is a few dozen bytes, which a sane pattern
// matches in a few hundred steps, and a catastrophic one (nested
// quantifiers) would try for longer than the run. Refused naming the flag
// where it does not compile.
inline std::unique_ptr<fsdp::text::Regex> freeze_pattern(const std::string& freeze) {
  if (freeze.empty()) return nullptr;
  try {
    return std::make_unique<fsdp::text::Regex>(freeze, /*steps_per_match=*/100'000, /*steps_per_search=*/1'000'000);
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, "--freeze '", freeze, "' is not a regular expression: ", e.what());
  }
}

// Whether --freeze's pattern matches `name`; refused naming the flag and the
// name where the pattern backtracks past its bound.
inline bool freezes(const fsdp::text::Regex& pattern, const std::string& name) {
  try {
    return pattern.found_in(name);
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, "--freeze: on the parameter name '", name, "', ", e.what());
  }
}

// Applies --freeze and the LoRA flags to `model` (before fully_shard):
// refuses a --freeze pattern that does not parse, matches none of the
// parameters (a typo) or all of them (nothing left to train), and --freeze
// with LoRA (LoRA freezes everything but its adapters already).
inline FineTuned apply_fine_tuning(const FineTuneFlags& f, torch::nn::Module& model, uint64_t seed) {
  check_fine_tune_flags(f);
  TORCH_CHECK(f.freeze.empty() || !f.lora(),
              "--freeze with --lora-rank: LoRA freezes every parameter but its adapters already (leave --freeze out)");
  TORCH_CHECK(f.base_dtype == "fp32" || f.lora(),
              "--base-dtype ", f.base_dtype, " needs --lora-rank: a frozen base in another dtype than the parameters "
              "that train mixes dtypes inside the model, which only LoRA's adapters convert at their boundary");
  FineTuned done;
  if (f.lora()) {
    done.lora = lora_options(f, seed);
    fsdp::lora::LoraReport report;
    try {
      report = fsdp::lora::apply(model, *done.lora);
    } catch (const c10::Error& e) {  // named by where its settings came from
      TORCH_CHECK(false, f.init_from_adapter.empty() ? "--lora-rank " + std::to_string(f.lora_rank)
                                                     : "--init-from-adapter '" + f.init_from_adapter +
                                                           "' (its adapter_config.json's r = " +
                                                           std::to_string(done.lora->rank()) + ")",
                  ": ", fsdp::error_message(e));
    }
    done.parameters = report.parameters;
    done.trainable = report.trainable;
    done.adapted = report.adapted;
    return done;
  }
  const std::unique_ptr<fsdp::text::Regex> pattern = freeze_pattern(f.freeze);
  int64_t frozen_tensors = 0, tensors = 0;
  const auto named = fsdp::unique_named_parameters(model);
  for (const auto& [name, param] : named) {
    done.parameters += param.numel();
    ++tensors;
    if (!pattern || !freezes(*pattern, name)) continue;
    param.requires_grad_(false);
    done.frozen_by_pattern += param.numel();
    ++frozen_tensors;
  }
  done.trainable = done.parameters - done.frozen_by_pattern;
  if (f.freeze.empty()) return done;
  TORCH_CHECK(frozen_tensors > 0, "--freeze '", f.freeze, "' matches none of the model's ", tensors,
              " parameter names (e.g. '", named.front().first, "'): expected a pattern that freezes some of them");
  TORCH_CHECK(frozen_tensors < tensors, "--freeze '", f.freeze, "' matches all ", tensors,
              " parameters of the model: expected some left to train");
  return done;
}

// The model's description for the planner, as fsdp-train will shard it
// (fsdp-plan's figures, fsdp-train's preflight and prediction): the config's;
// with --freeze or --lora-rank, each unit's trainable and frozen elements
// (ModelDescription::describe_units) of the model built with the flags
// applied, its shapes only (DeferredInit), wrapped as fully_shard wraps it
// (the config's wrap policy), for both wraps. Refuses what apply_fine_tuning
// refuses. `done` (optional): what apply_fine_tuning did.
inline fsdp::ModelDescription plan_description(const FineTuneFlags& f, const fsdp::models::ModelConfig& config,
                                               FineTuned* done = nullptr) {
  check_fine_tune_flags(f);
  fsdp::ModelDescription description = config.plan_description();
  if (f.freeze.empty() && !f.lora()) return description;  // no model to build: the config says it all
  fsdp::memory::install_counting_allocator();  // DeferredInit's (fsdp-train's main installed it already)
  fsdp::memory::DeferredInit shapes_only;
  const auto model = config.new_model();
  const FineTuned applied = apply_fine_tuning(f, *model, /*seed=*/0);  // the seed draws values, not shapes
  for (bool sublayer : {false, true}) description.describe_units(sublayer, *model, config.wrap_policy(sublayer));
  if (done) *done = applied;
  return description;
}

}  // namespace fsdp_tools
