#pragma once
// fsdp-cpp: fully sharded data parallel training for the LibTorch C++
// frontend. The one header a user includes:
//
//   #include <fsdp/fsdp.h>
//
//   fsdp::MpiEnvironment mpi(&argc, &argv);
//   auto model = fsdp::fully_shard(MyModel(...), mpi.world(),
//       fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<BlockImpl>()));
//   fsdp::FusedAdamW optimizer(model.parameters(), torch::optim::AdamWOptions(3e-4));
//   fsdp::TrainStep step(model, optimizer, fsdp::TrainStepOptions().clip_grad_norm(1.0));
//   for (...) step([&](int64_t micro) { return model.forward(x, y); });
//
// Every header below is installed and is the library's public API; the
// engine's own (flat parameters, the offload stores, kernels, LibTorch
// version shims) live in src/ and are not installed.

#include "fsdp/checkpoint.h"     // training checkpoints: save, load, list, prune, convert
#include "fsdp/checkpoint_manager.h"  // CheckpointManager: interval, keep-N, resume over stateful objects
#include "fsdp/checksum.h"       // the checksums our files carry (XXH3, FNV-1a)
#include "fsdp/comm.h"           // process groups (MPI, NCCL) and MpiEnvironment
#include "fsdp/device_choice.h"  // the device and collectives of a rank; the scheduler-world check
#include "fsdp/error.h"          // error messages without LibTorch's backtrace
#include "fsdp/evaluation.h"     // sharded evaluation: the mean loss over held-out sequences
#include "fsdp/fully_shard.h"    // fully_shard(), unit_forward(), UnshardScope
#include "fsdp/fused_adamw.h"    // FusedAdamW: AdamW in one pass over memory
#include "fsdp/gpt.h"            // the reference GPT (shared/spec/gpt.md)
#include "fsdp/grad_utils.h"     // clipping by the global norm, GradScaler, weight decay
#include "fsdp/host_memory.h"    // host-memory planning and the preflight
#include "fsdp/lr_schedule.h"    // warmup, constant and cosine learning rates
#include "fsdp/memory.h"         // exact tensor memory by category
#include "fsdp/memory_plan.h"    // the planner: memory and communication per strategy
#include "fsdp/offload.h"        // disk offload: its options and a read-only view
#include "fsdp/optimizer_state.h"  // the optimizers whose state can be sharded
#include "fsdp/options.h"        // FullyShardOptions, strategies, mixed precision
#include "fsdp/preemption.h"     // SIGTERM/SIGUSR1 as a collective stop at step boundaries
#include "fsdp/safetensors.h"    // safetensors files, read and written as streams
#include "fsdp/state_dict.h"     // full and sharded state dicts under the model's names
#include "fsdp/token_data.h"     // token files and the spec's data orders
#include "fsdp/trace.h"          // Chrome/Perfetto traces of units and collectives
#include "fsdp/train_step.h"     // TrainStep: one optimizer step of a sharded model
#include "fsdp/wrap_policy.h"    // which modules become units
