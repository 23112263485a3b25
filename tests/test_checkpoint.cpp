// Sharded checkpoints at W = 2, 3 and 4: every shardable optimizer resumes
// bit for bit (AdamW also on the Llama of every hub family's switch);
// another optimizer's state, and files with wrong tensors
// (of another dtype or shape, extra, missing), are refused naming the file
// and the tensor. The files themselves
// (safetensors, checksums) are tested in test_checkpoint_files.cpp.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "core/fsdp_state_impl.h"
#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_manager.h"
#include "fsdp/fully_shard.h"
#include "fsdp/gpt.h"
#include "plan/estimates.h"
#include "optim/optimizer_state.h"
#include "fsdp/safetensors.h"
#include "fsdp/token_data.h"
#include "fsdp/train_step.h"
#include "state_dict/checkpoint_json.h"
#include "mpi_test_env.h"
#include "sharded_test_helpers.h"
#include "test_helpers.h"
#include "state_dict/safetensors_metadata.h"

using fsdp::ShardingStrategy;
using fsdp::testing::world_group;
using fsdp::testing::batch;
using fsdp::testing::block_units;
using fsdp::testing::data_for;
using fsdp::testing::every_switch_llama;
using fsdp::testing::expect_same_params;
using fsdp::testing::make_gpt;
using fsdp::testing::make_model;
using fsdp::testing::options_for;
using fsdp::testing::spec_adamw;
using fsdp::testing::tiny;
using fsdp::testing::token_data;

namespace {

// Checkpoints keep every shardable optimizer's state: stopped after 2 steps,
// saved, reloaded into a fresh model and optimizer, and continued, the
// model equals one trained straight through, bit for bit. The model is
// `config`'s with a unit per block (decoder layer), trained on `data`.
template <class Optimizer, class Options>
void expect_exact_resume(const Options& options, const std::string& name, fsdp::CheckpointFormat format,
                         const fsdp::models::ModelConfig& config = tiny(),
                         const fsdp::models::TokenData& data = token_data()) {
  const std::string dir = "/tmp/fsdp_api_ckpt_" + name + "_" + std::to_string(world_group->size());
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  auto train = [&](auto& model, auto& train_step, int64_t from, int64_t to) {
    for (int64_t step = from; step < to; ++step) {
      train_step([&](int64_t micro) {
        auto [x, y] = batch(data, step, micro, 1, 2);
        return model(x, y);
      });
    }
  };
  const fsdp::FullyShardOptions units = fsdp::FullyShardOptions().wrap_policy(config.wrap_policy(false));
  auto straight = fsdp::fully_shard(make_model(config), world_group, units);
  Optimizer opt_straight(straight.parameters(), options);
  fsdp::TrainStep step_straight(straight, opt_straight);
  train(straight, step_straight, 0, 4);

  std::string path;
  {
    auto first = fsdp::fully_shard(make_model(config), world_group, units);
    Optimizer opt_first(first.parameters(), options);
    fsdp::TrainStep step_first(first, opt_first);
    train(first, step_first, 0, 2);
    path = fsdp::save_checkpoint(first.state(), opt_first, dir, 2, {}, format);
  }
  auto resumed = fsdp::fully_shard(make_model(config, 99), world_group, units);
  Optimizer opt_resumed(resumed.parameters(), options);
  const fsdp::CheckpointInfo info = fsdp::load_checkpoint(resumed.state(), opt_resumed, path);
  EXPECT_EQ(info.optimizer_type, fsdp::OptimizerState(opt_resumed).type());
  EXPECT_EQ(info.step, 2);
  fsdp::TrainStep step_resumed(resumed, opt_resumed);
  train(resumed, step_resumed, 2, 4);
  expect_same_params(resumed.state(), straight.state(), name + " " + fsdp::enum_name(format));
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(Checkpoint, EveryShardableOptimizerResumesExactly) {
  for (auto format : {fsdp::CheckpointFormat::kSharded, fsdp::CheckpointFormat::kFull}) {
    expect_exact_resume<torch::optim::AdamW>(spec_adamw(), "adamw", format);
    expect_exact_resume<torch::optim::Adam>(torch::optim::AdamOptions(1e-3).amsgrad(true), "adam_amsgrad", format);
    expect_exact_resume<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1), "sgd_momentum",
                                           format);
    expect_exact_resume<torch::optim::SGD>(torch::optim::SGDOptions(0.05), "sgd", format);
    // The hub families' switches (their biases, q/k norms, the tied head as one tensor) saved and resumed.
    expect_exact_resume<torch::optim::AdamW>(spec_adamw(), "adamw_every_switch_llama", format, every_switch_llama(),
                                             data_for(every_switch_llama()));
  }
}

TEST(Checkpoint, RefusesAnotherOptimizersState) {
  const std::string dir = "/tmp/fsdp_api_ckpt_mismatch_" + std::to_string(world_group->size());
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
  world_group->barrier()->wait();
  auto model = fsdp::fully_shard(make_gpt(tiny()), world_group, block_units());
  torch::optim::AdamW adamw(model.parameters(), spec_adamw());
  const std::string path = fsdp::save_checkpoint(model.state(), adamw, dir, 1);
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    fsdp::load_checkpoint(model.state(), sgd, path);
    ADD_FAILURE() << "an AdamW checkpoint loaded into SGD";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds the state of optimizer 'adamw'"), std::string::npos) << e.what();
  }
  torch::optim::LBFGS lbfgs(model.parameters(), torch::optim::LBFGSOptions(1.0));
  EXPECT_THROW(fsdp::save_checkpoint(model.state(), lbfgs, dir, 2), c10::Error);
  world_group->barrier()->wait();
  if (world_group->rank() == 0) std::filesystem::remove_all(dir);
}

namespace {

// Rewrites a checkpoint's file through `edit` (which may change, add or drop
// tensors), and lists the new file's checksum in a re-checksummed metadata,
// so that only the contents are wrong.
void tamper(const std::string& checkpoint, const std::string& file,
            const std::function<void(std::vector<fsdp::safetensors::TensorSpec>&, std::vector<torch::Tensor>&)>& edit) {
  const std::string path = checkpoint + "/" + file;
  std::vector<fsdp::safetensors::TensorSpec> specs;
  std::vector<torch::Tensor> values;
  {
    fsdp::safetensors::Reader reader(path);
    for (const auto& t : reader.tensors()) {
      specs.push_back(t.spec);
      values.push_back(reader.read(t.spec.name));
    }
  }
  edit(specs, values);
  fsdp::safetensors::Writer writer(path, specs);
  for (const auto& v : values) writer.write(v);
  writer.commit();
  nlohmann::json meta;
  std::ifstream(checkpoint + "/metadata.json") >> meta;
  meta["files"][file] = fsdp::safetensors::hex64(writer.checksum());
  fsdp::write_checkpoint_metadata(checkpoint, meta);
}

size_t index_of(const std::vector<fsdp::safetensors::TensorSpec>& specs, const std::string& name) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return i;
  throw std::runtime_error("no tensor " + name);
}

void expect_refused(const std::string& checkpoint, const std::string& what) {
  try {
    fsdp::SavedCheckpoint saved(checkpoint);
    ADD_FAILURE() << "a tampered checkpoint was accepted; expected: " << what;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(what), std::string::npos) << e.what_without_backtrace();
  }
}

}  // namespace

// Files that are intact as files (their checksums match) but hold the wrong
// tensors are refused by name, in both formats; the untouched checkpoint loads.
TEST(Checkpoint, WrongTensorsAreRefusedNamingFileAndTensor) {
  namespace fs = std::filesystem;
  const std::string dir = "/tmp/fsdp_test_tamper_w" + std::to_string(world_group->size());
  auto model = fsdp::fully_shard(fsdp::testing::make_gpt(tiny()), world_group, options_for(ShardingStrategy::kFullShard));
  torch::optim::AdamW optimizer(model.parameters(), fsdp::testing::spec_adamw());
  auto data = data_for(tiny());
  auto [x, y] = data.batch(0, 0, world_group->rank(), world_group->size(), 1, 2);
  model.forward(x, y).backward();
  optimizer.step();
  if (world_group->rank() == 0) fs::remove_all(dir);
  world_group->barrier()->wait();
  const std::string sharded = fsdp::save_checkpoint(model.state(), optimizer, dir + "/sharded", 1);
  const std::string full =
      fsdp::save_checkpoint(model.state(), optimizer, dir + "/full", 1, {}, fsdp::CheckpointFormat::kFull);
  fsdp::load_checkpoint(model.state(), optimizer, sharded);
  fsdp::load_checkpoint(model.state(), optimizer, full);
  world_group->barrier()->wait();
  if (world_group->rank() == 0) {
    auto copy = [&](const std::string& from, const std::string& name) {
      fs::copy(from, dir + "/" + name, fs::copy_options::recursive);
      return dir + "/" + name;
    };
    std::string c = copy(sharded, "dtype");
    tamper(c, "shard-0.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "u0.exp_avg");
      specs[i].dtype = torch::kBFloat16;
      values[i] = values[i].to(torch::kBFloat16);
    });
    expect_refused(c, "shard-0.safetensors': tensor 'u0.exp_avg' is BFloat16 of shape");
    c = copy(sharded, "extra");
    tamper(c, "shard-0.safetensors", [](auto& specs, auto& values) {
      specs.push_back({"u9.param", torch::kFloat, {3}});
      values.push_back(torch::zeros({3}));
    });
    expect_refused(c, "shard-0.safetensors' has a tensor 'u9.param' that the checkpoint's layout does not have");
    c = copy(full, "missing");
    tamper(c, "model.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "transformer.wte.weight");
      specs.erase(specs.begin() + i);
      values.erase(values.begin() + i);
    });
    expect_refused(c, "model.safetensors' has no tensor 'transformer.wte.weight'");
    c = copy(full, "shape");
    tamper(c, "optimizer.safetensors", [](auto& specs, auto& values) {
      const size_t i = index_of(specs, "transformer.wte.weight.exp_avg");
      specs[i].shape = {values[i].numel()};
      values[i] = values[i].flatten();
    });
    expect_refused(c, "optimizer.safetensors': tensor 'transformer.wte.weight.exp_avg' is Float of shape [16384]");
    // A file of another checkpoint, intact in itself, is refused too.
    c = copy(full, "swapped");
    fs::copy(full + "/model.safetensors", c + "/optimizer.safetensors", fs::copy_options::overwrite_existing);
    expect_refused(c, "optimizer.safetensors' has checksum");
    fs::remove_all(dir);
  }
  world_group->barrier()->wait();
}

// Asynchronous checkpoints (CheckpointManagerOptions::async).
namespace {

namespace fs = std::filesystem;

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every file of two checkpoint folders, byte for byte (metadata.json too).
void expect_same_files(const std::string& a, const std::string& b, const std::string& what) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(a)) names.push_back(entry.path().filename().string());
  size_t in_b = 0;
  for (const auto& entry : fs::directory_iterator(b)) in_b += entry.is_regular_file();
  EXPECT_EQ(names.size(), in_b) << what;
  for (const auto& name : names) {
    EXPECT_TRUE(file_bytes(fs::path(a) / name) == file_bytes(fs::path(b) / name)) << what << ": " << name << " differs";
  }
}

// The background write sleeps this long first (state_dict/save_faults.h), on every rank.
struct BackgroundWriteDelay {
  explicit BackgroundWriteDelay(int ms) {
    ::setenv("FSDP_TEST_BACKGROUND_WRITE_DELAY_MS", std::to_string(ms).c_str(), 1);
  }
  ~BackgroundWriteDelay() { ::unsetenv("FSDP_TEST_BACKGROUND_WRITE_DELAY_MS"); }
};

std::string fresh_dir(const std::string& name) {
  const std::string dir = "/tmp/fsdp_async_ckpt_" + name + "_w" + std::to_string(world_group->size());
  if (world_group->rank() == 0) fs::remove_all(dir);
  world_group->barrier()->wait();
  return dir;
}

// A tiny model trained `steps` steps, and its step.
struct Trained {
  fsdp::FullyShardedModule<fsdp::models::GPTImpl> model;
  torch::optim::AdamW optimizer;
  fsdp::TrainStep step;
  int64_t done = 0;
  Trained()
      : model(fsdp::fully_shard(make_gpt(tiny()), world_group, block_units())),
        optimizer(model.parameters(), spec_adamw()),
        step(model, optimizer) {}
  void train(int64_t steps) {
    for (int64_t end = done + steps; done < end; ++done) {
      step([&](int64_t micro) {
        auto [x, y] = batch(token_data(), done, micro, 1, 2);
        return model(x, y);
      });
    }
  }
};

}  // namespace

// An async save writes the files a synchronous save of the same state writes,
// byte for byte, in both formats, though training changed every parameter and
// moment while the write was delayed: the staging copy is a copy.
TEST(Checkpoint, AsyncSaveWritesTheSynchronousBytesWhileTrainingGoesOn) {
  for (auto format : {fsdp::CheckpointFormat::kSharded, fsdp::CheckpointFormat::kFull}) {
    const std::string name = fsdp::enum_name(format);
    const std::string sync_dir = fresh_dir("sync_" + name), async_dir = fresh_dir("async_" + name);
    Trained run;
    run.train(2);
    fsdp::CheckpointManager sync(run.model.state(), run.optimizer,
                                 fsdp::CheckpointManagerOptions(sync_dir).format(format));
    fsdp::CheckpointManager async(run.model.state(), run.optimizer,
                                  fsdp::CheckpointManagerOptions(async_dir).format(format).async(true));
    const fsdp::CheckpointSave written = sync.save(2);
    EXPECT_TRUE(written.published && !written.background);
    fsdp::CheckpointSave staged;
    {
      BackgroundWriteDelay delay(300);
      staged = async.save(2);
      EXPECT_TRUE(staged.background && !staged.published && async.in_flight());
      EXPECT_FALSE(fs::exists(async_dir + "/step-2")) << "published before its write";
      run.train(1);  // changes every shard and moment under the write
    }
    const auto published = async.wait();
    ASSERT_TRUE(published.has_value());
    EXPECT_TRUE(published->published && !async.in_flight());
    EXPECT_GT(published->write_seconds, 0.25);
    // The staging copy is what the planner counts (memory_plan.h), to the byte.
    std::vector<int64_t> numels;
    for (const auto& unit : fsdp::detail::units(run.model.state())) numels.push_back(unit->flat_param().numel());
    const fsdp::CheckpointStaging planned = fsdp::estimate_checkpoint_staging(
        numels, ShardingStrategy::kFullShard, world_group->size(), 0, format == fsdp::CheckpointFormat::kFull);
    EXPECT_EQ(staged.staged_bytes, world_group->rank() == 0 ? planned.rank0 : planned.per_rank) << name;
    EXPECT_EQ(staged.staged_bytes > 0, format == fsdp::CheckpointFormat::kSharded || world_group->rank() == 0) << name;
    if (world_group->rank() == 0) expect_same_files(sync_dir + "/step-2", async_dir + "/step-2", name);
    world_group->barrier()->wait();
    if (world_group->rank() == 0) fs::remove_all(sync_dir), fs::remove_all(async_dir);
  }
}

// At most one save in flight: a second save waits for the first (publishing
// it) and says so; poll() publishes a finished one at a step boundary.
TEST(Checkpoint, AsyncSecondSaveWaitsForTheFirst) {
  const std::string dir = fresh_dir("waits");
  Trained run;
  run.train(1);
  fsdp::CheckpointManager checkpoints(run.model.state(), run.optimizer,
                                      fsdp::CheckpointManagerOptions(dir).keep(5).async(true));
  {
    BackgroundWriteDelay delay(400);
    EXPECT_EQ(checkpoints.save(1).waited_seconds, 0.0);
    run.train(1);
    const fsdp::CheckpointSave second = checkpoints.save(2);
    EXPECT_GT(second.waited_seconds, 0.0);
    EXPECT_GE(second.seconds, second.waited_seconds + second.staging_seconds - 1e-9);
    EXPECT_EQ(checkpoints.saves_waited(), 1);
    EXPECT_EQ(second.previous_path, dir + "/step-1");
    EXPECT_GT(second.previous_write_seconds, 0.35);
    EXPECT_TRUE(fs::exists(dir + "/step-1/metadata.json")) << "the first save was not published before the second";
    EXPECT_FALSE(fs::exists(dir + "/step-2"));
  }
  std::optional<fsdp::CheckpointSave> published;
  for (int tries = 0; !published && tries < 600; ++tries) {  // poll as a training loop would, every 50 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    published = checkpoints.poll();
  }
  ASSERT_TRUE(published.has_value()) << "poll() never published the second save";
  EXPECT_EQ(published->path, dir + "/step-2");
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-2");
  EXPECT_FALSE(checkpoints.poll().has_value());
  EXPECT_FALSE(checkpoints.wait().has_value());
  fsdp::SavedCheckpoint(dir + "/step-2");  // verifies every file
  world_group->barrier()->wait();
  if (world_group->rank() == 0) fs::remove_all(dir);
}

// A background write that fails is reported at the next wait point, on every
// rank, naming the checkpoint and the cause; the previous checkpoint stays the
// newest complete one, and the manager saves again afterwards.
TEST(Checkpoint, AsyncWriteErrorSurfacesAtTheNextWait) {
  const std::string dir = fresh_dir("error");
  Trained run;
  fsdp::CheckpointManager checkpoints(run.model.state(), run.optimizer,
                                      fsdp::CheckpointManagerOptions(dir).keep(5).async(true));
  checkpoints.save(0);
  checkpoints.wait();
  run.train(1);
  {
    BackgroundWriteDelay delay(500);
    checkpoints.save(1);
    if (world_group->rank() == 0) {  // the folder replaced by a file under the write
      fs::remove_all(dir + "/step-1.tmp");
      std::ofstream(dir + "/step-1.tmp") << "in the way";
    }
    world_group->barrier()->wait();
  }
  try {
    checkpoints.wait();
    ADD_FAILURE() << "a failed background write was not reported";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("checkpoint '" + dir + "/step-1': the background write failed on rank"), std::string::npos)
        << message;
    EXPECT_NE(message.find("step-1.tmp/shard-"), std::string::npos) << message;
  }
  EXPECT_FALSE(checkpoints.in_flight());
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-0");
  world_group->barrier()->wait();
  if (world_group->rank() == 0) fs::remove(dir + "/step-1.tmp");
  checkpoints.save(2);
  ASSERT_TRUE(checkpoints.wait().has_value());
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-2");
  world_group->barrier()->wait();
  if (world_group->rank() == 0) fs::remove_all(dir);
}
