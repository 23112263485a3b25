// The library parts a training program is made of, each on its own, on 2
// and 3 ranks: the checkpoint manager and its stateful objects, the
// shared-folder probe, sharded evaluation, the preemption flag, host-memory
// planning and the preflight, device choice and the scheduler-world check.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "fsdp/checkpoint_manager.h"
#include "fsdp/device_choice.h"
#include "fsdp/evaluation.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "fsdp/grad_utils.h"
#include "plan/host_memory.h"
#include "base/strings.h"
#include "core/host_resources.h"
#include "fsdp/preemption.h"
#include "fsdp/state_dict.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "mpi_test_env.h"
#include "test_helpers.h"
#include "models/evaluation_defaults.h"

using fsdp::testing::block_units;
using fsdp::testing::make_gpt;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::world_group;

namespace {

const fsdp::models::TokenData& token_data() {
  static fsdp::models::TokenData data(fsdp::testing::make_token_file("run_parts", 20000, 256), tiny().context, 256,
                                      fsdp::models::TokenDataOptions().val_fraction(0.2));
  return data;
}

// A fresh folder, the same path on every rank.
std::string fresh_folder(const std::string& name) {
  const std::string dir = "/tmp/fsdp_run_parts_" + name + "_" + std::to_string(world_group->size());
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  return dir;
}

// The error text of `f`'s c10::Error ("" if it threw none), on every rank.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Every parameter's full value, by name.
std::map<std::string, torch::Tensor> full_params(fsdp::FsdpState& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : fsdp::full_state_dict(state)) out[item.key()] = item.value();
  return out;
}

void train_steps(fsdp::FullyShardedModule<fsdp::models::GPTImpl>& model, fsdp::TrainStep& step, int64_t from,
                 int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    step([&](int64_t micro) {
      auto [x, y] = token_data().batch(s, micro, world_group->rank(), world_group->size(), 1, 2);
      return model(x, y);
    });
  }
}

TEST(CheckpointManager, DueEveryKStepsAndAfterTheLast) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW optimizer(model.parameters(), spec_adamw());
  fsdp::CheckpointManager every3(model.state(), optimizer, fsdp::CheckpointManagerOptions("/tmp/unused").every(3));
  std::vector<int64_t> due;
  for (int64_t s = 1; s <= 10; ++s) {
    if (every3.due(s, 10)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9, 10}));
  fsdp::CheckpointManager last_only(model.state(), optimizer, fsdp::CheckpointManagerOptions("/tmp/unused"));
  EXPECT_FALSE(last_only.due(4, 10));
  EXPECT_TRUE(last_only.due(10, 10));
  EXPECT_THROW(fsdp::CheckpointManager(model.state(), optimizer, fsdp::CheckpointManagerOptions("x").keep(0)),
               c10::Error);
}

// Saved after steps 1 and 2 with every object, pruned to the newest one, resumed
// into a fresh model: the objects get their states back, and training on
// equals training straight through, bit for bit.
TEST(CheckpointManager, SavesKeepsAndResumesExactly) {
  const std::string dir = fresh_folder("resume");
  const auto schedule = fsdp::LrSchedule().lr(1e-3).total_steps(4);
  const auto order = fsdp::models::TokenDataOptions().order(fsdp::models::DataOrder::kShuffled).seed(5);
  auto straight = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW opt_straight(straight.parameters(), spec_adamw());
  fsdp::TrainStep step_straight(straight, opt_straight);
  train_steps(straight, step_straight, 0, 4);
  {
    auto first = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
    torch::optim::AdamW optimizer(first.parameters(), spec_adamw());
    fsdp::TrainStep step(first, optimizer);
    fsdp::CheckpointManager manager(first.state(), optimizer, fsdp::CheckpointManagerOptions(dir).keep(1));
    fsdp::LrScheduleState schedule_state(schedule);
    fsdp::DataOrderState data_state(order);
    fsdp::GradScaler scaler(first.state());
    scaler.set_scale_factor(128.0);
    fsdp::LossScaleState scale_state(scaler);
    auto note = fsdp::RecordedValue::text("a note");
    manager.add("lr_schedule", schedule_state);
    manager.add("data", data_state);
    manager.add("loss_scale", scale_state);
    manager.add("note", note);
    EXPECT_THROW(manager.add("note", note), c10::Error);
    for (int64_t s = 0; s < 2; ++s) {
      train_steps(first, step, s, s + 1);
      const fsdp::CheckpointSave saved = manager.save(s + 1);
      EXPECT_EQ(saved.path, dir + "/step-" + std::to_string(s + 1));
    }
    EXPECT_TRUE(std::filesystem::exists(dir + "/step-2"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/step-1"));  // --keep 1
  }
  auto resumed = fsdp::fully_shard(make_gpt(tiny(), 99), world_group, block_units());
  torch::optim::AdamW optimizer(resumed.parameters(), spec_adamw());
  fsdp::CheckpointManager manager(resumed.state(), optimizer, fsdp::CheckpointManagerOptions(dir));
  fsdp::LrScheduleState schedule_state(schedule);
  fsdp::DataOrderState data_state(order);
  fsdp::TrainStep step(resumed, optimizer);
  fsdp::GradScaler scaler(resumed.state());
  fsdp::LossScaleState scale_state(scaler);
  manager.add("lr_schedule", schedule_state);
  manager.add("data", data_state);
  manager.add("loss_scale", scale_state);
  const auto info = manager.resume();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->info.step, 2);
  EXPECT_EQ(info->info.world_size, world_group->size());
  EXPECT_EQ(info->info.extra.at("note"), "\"a note\"");
  EXPECT_EQ(scaler.scale_factor(), 128.0);
  train_steps(resumed, step, 2, 4);
  const auto a = full_params(resumed.state()), b = full_params(straight.state());
  for (const auto& [name, value] : b) EXPECT_TRUE(torch::equal(a.at(name), value)) << name;
}

// Each object refuses a checkpoint of another run, naming both values.
TEST(CheckpointManager, ObjectsRefuseAMismatchNamingBoth) {
  const std::string dir = fresh_folder("mismatch");
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW optimizer(model.parameters(), spec_adamw());
  {
    fsdp::CheckpointManager manager(model.state(), optimizer, fsdp::CheckpointManagerOptions(dir));
    fsdp::LrScheduleState schedule(fsdp::LrSchedule().kind(fsdp::LrScheduleKind::kCosine).lr(2e-3).total_steps(10));
    fsdp::DataOrderState data(fsdp::models::TokenDataOptions().seed(0));
    manager.add("lr_schedule", schedule);
    manager.add("data", data);
    manager.save(1);
  }
  fsdp::CheckpointManager manager(model.state(), optimizer, fsdp::CheckpointManagerOptions(dir));
  fsdp::DataOrderState other_seed(fsdp::models::TokenDataOptions().seed(1), ": pass the same seed");
  manager.add("data", other_seed);
  const std::string data_error = error_of([&] { manager.resume(); });
  EXPECT_NE(data_error.find("was trained with data order {\"order\":\"sequential\",\"seed\":0,"), std::string::npos)
      << data_error;
  EXPECT_NE(data_error.find("this run asks for {\"order\":\"sequential\",\"seed\":1,"), std::string::npos) << data_error;
  EXPECT_NE(data_error.find(": pass the same seed"), std::string::npos) << data_error;

  fsdp::CheckpointManager again(model.state(), optimizer, fsdp::CheckpointManagerOptions(dir));
  fsdp::LrScheduleState constant(fsdp::LrSchedule().lr(2e-3).warmup_steps(3).total_steps(10));
  again.add("lr_schedule", constant);
  const std::string schedule_error = error_of([&] { again.resume(); });
  EXPECT_NE(schedule_error.find("the learning-rate schedule 'cosine from 0.002"), std::string::npos) << schedule_error;
  EXPECT_NE(schedule_error.find("this run asks for 'constant 0.002, 3 warmup steps'"), std::string::npos)
      << schedule_error;

  // A checkpoint without an object's key is taken as it is.
  fsdp::CheckpointManager absent(model.state(), optimizer, fsdp::CheckpointManagerOptions(dir));
  fsdp::GradScaler scaler(model.state());
  fsdp::LossScaleState scale(scaler);
  absent.add("loss_scale", scale);
  EXPECT_TRUE(absent.resume().has_value());
  EXPECT_EQ(scaler.scale_factor(), fsdp::GradScalerOptions().init_scale());
  // And an empty folder holds nothing to resume.
  fsdp::CheckpointManager empty(model.state(), optimizer, fsdp::CheckpointManagerOptions(fresh_folder("empty")));
  EXPECT_FALSE(empty.resume().has_value());
}

TEST(CheckFolderShared, PassesOnASharedFolderAndNamesTheRanksThatCannotSee) {
  EXPECT_NO_THROW(fsdp::check_folder_shared(fresh_folder("shared"), world_group));
  // A folder of each rank's own: ranks 1.. cannot see rank 0's probe.
  const std::string own = fresh_folder("private") + "/rank" + std::to_string(world_group->rank());
  std::filesystem::create_directories(own);
  const std::string error = error_of([&] { fsdp::check_folder_shared(own, world_group); });
  std::string ranks = "1";
  for (int r = 2; r < world_group->size(); ++r) ranks += ", " + std::to_string(r);
  EXPECT_NE(error.find("is not shared: rank(s) " + ranks + " cannot see"), std::string::npos) << error;
}

// The sharded validation loss is the mean of the whole model's per-sequence
// losses over the first E held-out sequences.
TEST(Evaluation, MatchesTheWholeModelsMean) {
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  const int W = world_group->size();
  const int64_t sequences = 4 * W;
  auto loss = [&](const torch::Tensor& x, const torch::Tensor& y) { return model.forward(x, y); };
  const double sharded = fsdp::evaluate_loss(model.state(), loss, token_data(), world_group,
                                             fsdp::EvaluationOptions().sequences(sequences).batch(3));
  auto whole = make_gpt(tiny());
  torch::NoGradGuard no_grad;
  double sum = 0.0;
  for (int64_t i = 0; i < sequences; ++i) {
    auto [x, y] = token_data().val_batch(i, 1);
    sum += whole->forward(x, y).item<double>();
  }
  EXPECT_NEAR(sharded, sum / static_cast<double>(sequences), 1e-4);
  EXPECT_EQ(fsdp::default_evaluation_sequences(3), 66);
  EXPECT_EQ(fsdp::default_evaluation_sequences(2), 64);
  EXPECT_THROW(fsdp::evaluate_loss(model.state(), loss, token_data(), world_group,
                                   fsdp::EvaluationOptions().sequences(W + 1)),
               c10::Error);
}

// A signal on the last rank alone: every rank agrees to stop at the next
// boundary; only that rank was signalled itself.
TEST(Preemption, OneRanksSignalStopsEveryRank) {
  const fsdp::Preemption preemption;
  EXPECT_FALSE(preemption.agreed_to_stop(world_group));
  const bool last = world_group->rank() == world_group->size() - 1;
  if (last) std::raise(SIGUSR1);
  EXPECT_TRUE(preemption.agreed_to_stop(world_group));
  EXPECT_EQ(preemption.signal_here(), last ? SIGUSR1 : 0);
}

fsdp::PlannedRun small_run() {
  fsdp::PlannedRun run;
  run.model = fsdp::models::GPTConfig::preset("small").plan_description();
  run.settings.world = 2;
  run.settings.ranks_here = 2;
  return run;
}

TEST(HostMemory, AvailableHonoursTheOverride) {
  const char* saved = std::getenv("FSDP_PREFLIGHT_AVAILABLE_BYTES");
  ::setenv("FSDP_PREFLIGHT_AVAILABLE_BYTES", "12345", 1);
  EXPECT_EQ(fsdp::host_memory_available(), 12345);
  ::unsetenv("FSDP_PREFLIGHT_AVAILABLE_BYTES");
  EXPECT_GT(fsdp::host_memory_available(), 0);  // /proc/meminfo
  if (saved) ::setenv("FSDP_PREFLIGHT_AVAILABLE_BYTES", saved, 1);
  EXPECT_EQ(fsdp::format_mib(671088640), "640.00 MiB");
}

// The need: runtime beside the planner's figures; sharded initialization and
// activation checkpointing need less; the preflight refuses what does not
// fit, listing the variants, and passes what does.
TEST(HostMemory, PreflightRefusesWhatDoesNotFit) {
  const fsdp::PlannedRun run = small_run();
  fsdp::PlannedRun lean = run;
  lean.settings.sharded_init = true;
  lean.options.activation_checkpointing(true);
  const int64_t need = fsdp::host_memory_needed(run);
  EXPECT_GT(need, fsdp::kHostRuntimeBytes);
  EXPECT_LT(fsdp::host_memory_needed(lean), need);
  // Rank 0 also holds Open MPI's two copies of a block's whole fp32
  // gradient while it reduce-scatters it; replicated gradients have none.
  const int64_t block = (fsdp::plan_run(run).unit_numels[1] + 1) / 2 * 2;
  const fsdp::HostMemoryNeed here = fsdp::preflight_host_memory(run, 3 * need);
  EXPECT_EQ(here.per_rank, need);
  EXPECT_EQ(here.reduce_scatter_buffers, 2 * 4 * block);
  EXPECT_EQ(here.host, 2 * need + here.reduce_scatter_buffers);
  EXPECT_EQ(here.all_ranks, here.host);
  fsdp::PlannedRun replicated = run;
  replicated.options.strategy(fsdp::ShardingStrategy::kNoShard);
  EXPECT_EQ(fsdp::host_memory_need(replicated).reduce_scatter_buffers, 0);
  // Two hosts of 2 ranks, one shard group over both: each host is planned
  // with the group's first rank, the world with it once.
  fsdp::PlannedRun across = run;
  across.settings.world = 4;
  const fsdp::HostMemoryNeed two_hosts = fsdp::host_memory_need(across);
  EXPECT_EQ(two_hosts.host, 2 * two_hosts.per_rank + two_hosts.reduce_scatter_buffers);
  EXPECT_EQ(two_hosts.all_ranks, 4 * two_hosts.per_rank + two_hosts.reduce_scatter_buffers);
  const std::string error = error_of([&] { fsdp::preflight_host_memory(run, 2 * need); });
  EXPECT_NE(error.find("preflight: this run needs about " + fsdp::format_mib(need) + " per rank"), std::string::npos)
      << error;
  EXPECT_NE(error.find("2 rank(s) here and MPI's reduce-scatter buffers (" + fsdp::format_mib(2 * 4 * block) +
                       "): " + fsdp::format_mib(here.host) + ", but the host has " + fsdp::format_mib(2 * need) +
                       " available"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("\n  --sharded-init --activation-checkpointing: "), std::string::npos) << error;
  const auto variants = fsdp::host_memory_variants(run);
  EXPECT_EQ(variants.size(), 5u);  // fp32 and sharded: the parameters' disk offload too
  EXPECT_EQ(fsdp::host_memory_variants(replicated).size(), 4u);
  // Each variant is the run with other options, as fully_shard would take them.
  EXPECT_TRUE(variants[1].run.options.activation_checkpointing() && variants[1].run.settings.sharded_init);
  EXPECT_EQ(variants[1].flags, "--sharded-init --activation-checkpointing");
  EXPECT_TRUE(variants[4].run.options.offload().nvme_options() && variants[4].run.options.offload().nvme_options()->params());
}

// The disk: this host's ranks' scratch files together (the planner's size
// each) against the folder's free space, refused naming both.
TEST(HostMemory, PreflightChecksTheScratchFilesTogether) {
  fsdp::PlannedRun run = small_run();
  EXPECT_EQ(fsdp::preflight_scratch_space(run, 0), 0);  // nothing on disk
  run.options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions("/scratch-folder").optimizer_state(true)));
  const int64_t file = fsdp::plan_run(run).nvme->file_bytes;
  ASSERT_GT(file, 0);
  EXPECT_EQ(fsdp::preflight_scratch_space(run, 2 * file), 2 * file);
  const std::string error = error_of([&] { fsdp::preflight_scratch_space(run, 2 * file - 1); });
  EXPECT_NE(error.find("scratch files need " + std::to_string(2 * file) + " bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("in '/scratch-folder', which has " + std::to_string(2 * file - 1) + " bytes"), std::string::npos)
      << error;
  const char* saved = std::getenv("FSDP_PREFLIGHT_DISK_FREE_BYTES");
  ::setenv("FSDP_PREFLIGHT_DISK_FREE_BYTES", "12345", 1);
  EXPECT_EQ(fsdp::scratch_space_available("/no-such-folder", 2), 12345);
  ::unsetenv("FSDP_PREFLIGHT_DISK_FREE_BYTES");
  EXPECT_GT(fsdp::scratch_space_available("/tmp", 2), 0);  // statvfs
  if (saved) ::setenv("FSDP_PREFLIGHT_DISK_FREE_BYTES", saved, 1);
}

TEST(DeviceChoice, TheCpuIsTheWorldOverMpi) {
  const fsdp::DeviceChoice choice = fsdp::choose_device(c10::DeviceType::CPU, fsdp::CollectiveBackend::kAuto, world_group);
  EXPECT_TRUE(choice.device.is_cpu());
  EXPECT_EQ(choice.backend, "mpi");
  EXPECT_EQ(choice.group, world_group);
  EXPECT_THROW(fsdp::choose_device(c10::DeviceType::CPU, fsdp::CollectiveBackend::kNccl, world_group), c10::Error);
  if (!fsdp::cuda_build()) {
    const std::string error =
        error_of([] { fsdp::choose_device(c10::DeviceType::CUDA, fsdp::CollectiveBackend::kAuto, world_group); });
    EXPECT_NE(error.find("built without CUDA"), std::string::npos) << error;
  }
}

TEST(SchedulerWorld, RefusesAWorldOfOneWhereTheSchedulerStartedMore) {
  const char* mpirun = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::string saved = mpirun ? mpirun : "";
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("SLURM_NTASKS", "4", 1);
  const std::string error = error_of([] { fsdp::check_scheduler_world(1); });
  EXPECT_NE(error.find("the scheduler started 4 tasks (SLURM_NTASKS=4), but MPI sees a world of 1"), std::string::npos)
      << error;
  EXPECT_NO_THROW(fsdp::check_scheduler_world(4));
  ::unsetenv("SLURM_NTASKS");
  EXPECT_NO_THROW(fsdp::check_scheduler_world(1));
  if (mpirun) ::setenv("OMPI_COMM_WORLD_SIZE", saved.c_str(), 1);
}

}  // namespace
