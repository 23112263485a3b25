// A user's own model, fully sharded: a residual MLP regressor whose hidden
// blocks are FSDP units. Run it with:  build/fsdp-run -n 2 -- build/example-mlp
// With a folder, it saves a checkpoint after step 50 there, and a run given
// the same folder again resumes from it (on any number of ranks):
//   build/fsdp-run -n 2 -- build/example-mlp ckpt
//
// The only FSDP-specific lines are marked "FSDP:".

#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "fsdp/fsdp.h"

struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::relu(up(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(ResidualBlock);

struct RegressorImpl : torch::nn::Module {
  RegressorImpl(int64_t in, int64_t width, int64_t depth)
      : embed(register_module("embed", torch::nn::Linear(in, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(width, 1))) {
    for (int64_t i = 0; i < depth; ++i) blocks->push_back(ResidualBlock(width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = embed(x);
    for (const auto& block : *blocks) {
      h = fsdp::unit_forward(*block->as<ResidualBlockImpl>(), h);  // FSDP: a unit boundary
    }
    return head(h).squeeze(-1);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Regressor);

int main(int argc, char** argv) {
  fsdp::MpiEnvironment mpi(&argc, &argv);  // FSDP: one per process
  auto group = mpi.world();
  const int rank = group->rank(), world = group->size();

  torch::manual_seed(0);  // every rank builds the same initial model
  Regressor net(/*in=*/16, /*width=*/64, /*depth=*/4);
  auto model = fsdp::fully_shard(net, group,  // FSDP: shard every ResidualBlock as a unit
                                 fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<ResidualBlockImpl>()));
  torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(3e-3));  // local shards only

  // A fixed target function; each rank draws its own part of the batch.
  torch::manual_seed(1234);
  torch::Tensor w_true = torch::randn({16});
  torch::manual_seed(1000 + rank);
  const std::string ckpt_dir = argc > 1 ? argv[1] : "";  // empty: no checkpoints
  int64_t first_step = 1;
  if (!ckpt_dir.empty() && std::filesystem::exists(ckpt_dir + "/step-50")) {
    // FSDP: every rank loads its shards and optimizer state (collective); info says what was saved.
    const fsdp::CheckpointInfo info = fsdp::load_checkpoint(model.state(), optimizer, ckpt_dir + "/step-50");
    first_step = info.step + 1;
    if (rank == 0) std::cout << "resumed from " << info.path << " (step " << info.step << ", saved by "
                             << info.world_size << " ranks)\n";
  }
  double first_loss = 0.0, last_loss = 0.0;  // the mean over the ranks, alike on every rank
  for (int64_t step = first_step; step <= 100; ++step) {
    torch::Tensor x = torch::randn({32, 16});
    torch::Tensor y = torch::sin(x.matmul(w_true));
    torch::Tensor loss = torch::mse_loss(model.forward(x), y);
    optimizer.zero_grad();
    loss.backward();  // gradients are averaged over the ranks into each shard
    optimizer.step();
    torch::Tensor mean_loss = loss.detach().clone();
    group->all_reduce(mean_loss, fsdp::ReduceOp::kAvg)->wait();
    last_loss = mean_loss.item<double>();
    if (step == first_step) first_loss = last_loss;
    if (rank == 0 && (step == 1 || step % 20 == 0))
      std::cout << "step " << step << " loss " << mean_loss.item<double>() << "\n";
    if (!ckpt_dir.empty() && step == 50) {
      // FSDP: every rank writes its shards (collective); the path is ckpt_dir/step-50.
      const std::string path = fsdp::save_checkpoint(model.state(), optimizer, ckpt_dir, step);
      if (rank == 0) std::cout << "saved " << path << "\n";
    }
  }
  int64_t shard_elements = 0;
  for (const auto& shard : model.parameters()) shard_elements += shard.numel();
  std::cout << "rank " << rank << " of " << world << " holds " << shard_elements << " parameter elements in "
            << model.state().num_units() << " unit shards\n";
  // It learned: every rank exits non-zero if the loss did not fall (from step 1: a resumed run
  // starts where most of the fall is behind it).
  if (first_step == 1 && !(last_loss < first_loss)) {
    if (rank == 0) std::cerr << "example-mlp: the loss did not fall: " << first_loss << " -> " << last_loss << "\n";
    return 1;
  }
  return 0;
}
