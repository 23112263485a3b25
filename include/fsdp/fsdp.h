#pragma once
/// \file
/// The umbrella header: the one header a user includes (every fsdp-cpp header below).
///
/// Every header it includes is installed and is the library's public API; the
/// engine's own (flat parameters, the offload stores, kernels, LibTorch
/// version shims) are the library's own and are not installed. The memory
/// planner, which a training program does not need, is a library of its own
/// (fsdp::fsdp_plan): include fsdp/run_plan.h (one run's plan, plan_run) and
/// fsdp/memory_plan.h (its figures), and link it. Its estimates and the
/// host-memory preflight are its own (src/plan/), for the tools.

/// \mainpage fsdp-cpp: fully sharded data parallel training for LibTorch's C++ frontend
///
/// fsdp-cpp trains a `torch::nn::Module` written in C++ whose parameters,
/// gradients and optimizer state do not fit on one device, as PyTorch's FSDP
/// and DeepSpeed's ZeRO do in Python: each rank keeps a shard of every unit
/// and gathers a unit's parameters only while it computes. MPI carries the
/// collectives on CPUs and across hosts, NCCL on NVIDIA GPUs.
///
/// \code{.cpp}
/// #include <fsdp/fsdp.h>
///
/// fsdp::MpiEnvironment mpi(&argc, &argv);
/// auto model = fsdp::fully_shard(MyModel(...), mpi.world(),
///     fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<BlockImpl>()));
/// fsdp::FusedAdamW optimizer(model.parameters(), torch::optim::AdamWOptions(3e-4));
/// fsdp::TrainStep step(model, optimizer, fsdp::TrainStepOptions().clip_grad_norm(1.0));
/// for (...) step([&](int64_t micro) { return model.forward(x, y); });
/// \endcode
///
/// Where to start:
/// - \ref fsdp::fully_shard "fully_shard()" shards a model over a process group
///   (\ref fsdp::MpiEnvironment, \ref fsdp::make_nccl_process_group); \ref fsdp::FullyShardOptions
///   chooses the strategy (\ref fsdp::ShardingStrategy), mixed precision, prefetch and offload,
///   and \ref fsdp::unit_forward marks the unit boundaries in the model.
/// - \ref fsdp::TrainStep runs one optimizer step: gradient accumulation, loss scaling,
///   clipping (\ref fsdp::TrainStepOptions).
/// - State dicts under the model's own names: \ref fsdp::full_state_dict,
///   \ref fsdp::sharded_state_dict and their loaders (fsdp/state_dict.h).
/// - Checkpoints: \ref fsdp::save_checkpoint and \ref fsdp::load_checkpoint (any world size and
///   strategy), \ref fsdp::CheckpointManager (interval, keep-N, resume with stateful objects).
/// - Memory: fsdp/memory.h counts it; the planner (fsdp::fsdp_plan: \ref fsdp::plan_run,
///   whose \ref fsdp::RunPlan holds the figures) plans it.
/// - Names: \ref fsdp::enum_name and \ref fsdp::parse_enum name and parse every option's enum.
///
/// The Files page lists each header with what it is for.

/// \namespace fsdp
/// The library's public API: sharding, the training step, state dicts,
/// checkpoints, process groups and the planner.
/// \namespace fsdp::models
/// The reference GPT of shared/spec/gpt.md and its token data.
/// \namespace fsdp::memory
/// Exact tensor-memory accounting by category, the host block cache, and
/// deferred initialization.
/// \namespace fsdp::checksum
/// The checksums our files carry (XXH3-64; FNV-1a 64 for reading old files).
/// \namespace fsdp::safetensors
/// safetensors files, read with every offset checked and written as streams.
/// \namespace fsdp::offload
/// Disk offload's options and its read-only view (the machinery is the library's own).
/// \namespace fsdp::trace
/// Chrome/Perfetto traces of units, collectives and the caller's own spans.

#include "fsdp/attention.h"      // causal attention, fused (scaled_dot_product_attention) or written out
#include "fsdp/chat_encoding.h"  // conversations rendered, tokenized, their answers' loss mask; link fsdp::fsdp_text
#include "fsdp/chat_template.h"  // Hugging Face chat templates rendered as transformers does; link fsdp::fsdp_text
#include "fsdp/checkpoint.h"     // training checkpoints: save, load, find the latest, convert
#include "fsdp/checkpoint_manager.h"  // CheckpointManager: interval, keep-N, resume over stateful objects
#include "fsdp/checksum.h"       // the checksum algorithms our files name (XXH3, FNV-1a)
#include "fsdp/comm.h"           // process groups (MPI, NCCL) and MpiEnvironment
#include "fsdp/enum_names.h"     // enum_name and parse_enum: every option's names
#include "fsdp/device_choice.h"  // the device and collectives of a rank; the scheduler-world check
#include "fsdp/error.h"          // error messages without LibTorch's backtrace
#include "fsdp/evaluation.h"     // sharded evaluation: the mean loss over held-out sequences or answers
#include "fsdp/fully_shard.h"    // fully_shard(), unit_forward(), UnshardScope
#include "fsdp/fused_adamw.h"    // FusedAdamW: AdamW in one pass over memory
#include "fsdp/gpt.h"            // the reference GPT (shared/spec/gpt.md)
#include "fsdp/grad_utils.h"     // clipping by the global norm, GradScaler
#include "fsdp/hugging_face.h"   // Hugging Face GPT-2 and Llama folders (config.json, model.safetensors) in and out
#include "fsdp/language_model.h"  // LanguageModel: what the trainer needs of a GPT or a Llama
#include "fsdp/llama.h"          // the Llama (Hugging Face LlamaForCausalLM's names and semantics)
#include "fsdp/lora.h"            // LoRA adapters on a model's linears, as PEFT builds them
#include "fsdp/peft.h"            // LoRA adapters in and out of PEFT's folders, merged into the weights
#include "fsdp/lr_schedule.h"    // warmup, constant and cosine learning rates
#include "fsdp/memory.h"         // exact tensor memory by category
#include "fsdp/model_config.h"   // ModelConfig: one model's configuration, of any family
#include "fsdp/model_description.h"  // what a model tells the planner of itself
#include "fsdp/offload.h"        // disk offload: its options and a read-only view
#include "fsdp/options.h"        // FullyShardOptions, strategies, mixed precision
#include "fsdp/preemption.h"     // SIGTERM/SIGUSR1 as a collective stop at step boundaries
#include "fsdp/safetensors.h"    // safetensors files, read and written as streams
#include "fsdp/state_dict.h"     // full and sharded state dicts under the model's names
#include "fsdp/token_data.h"     // token files and the spec's data orders; packed conversations
#include "fsdp/tokenizer.h"      // Hugging Face tokenizer.json (byte-level BPE); link fsdp::fsdp_text for it
#include "fsdp/trace.h"          // Chrome/Perfetto traces of units and collectives
#include "fsdp/train_step.h"     // TrainStep: one optimizer step of a sharded model
#include "fsdp/wrap_policy.h"    // which modules become units
