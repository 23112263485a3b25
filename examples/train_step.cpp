// A user's own model trained with the library's training step: a residual
// MLP regressor whose blocks are FSDP units, fsdp::TrainStep for gradient
// accumulation and clipping, fsdp::FusedAdamW on this rank's shards. The
// options choose the strategy, the precision and where the model's state
// lives between uses:
//
//   build/fsdp-run -n 2 -- build/example-train-step
//   build/fsdp-run -n 2 -- build/example-train-step --strategy shard_grad_op --param-dtype bf16
//   build/fsdp-run -n 2 -- build/example-train-step --nvme-offload /var/tmp/fsdp-offload
//   build/fsdp-run -n 2 -- build/example-train-step --device cuda --cpu-offload   # a GPU per rank
//
// Every rank exits non-zero unless the loss fell.

#include <torch/torch.h>

#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>

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

// forward(x, y) returns the mean squared error of the prediction for x.
struct RegressorImpl : torch::nn::Module {
  RegressorImpl(int64_t in, int64_t width, int64_t depth)
      : embed(register_module("embed", torch::nn::Linear(in, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(width, 1))) {
    for (int64_t i = 0; i < depth; ++i) blocks->push_back(ResidualBlock(width));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor h = embed(x);
    for (const auto& block : *blocks) {
      h = fsdp::unit_forward(*block->as<ResidualBlockImpl>(), h);  // FSDP: a unit boundary
    }
    return torch::mse_loss(head(h).squeeze(-1).to(torch::kFloat), y);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Regressor);

struct Args {
  int64_t steps = 40;
  int64_t micro_steps = 2;
  std::string strategy = "full_shard";
  std::string param_dtype = "fp32";
  std::string device = "cpu";
  bool cpu_offload = false;
  std::string nvme_dir;  // empty: no disk offload
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--steps") args.steps = std::stoll(value());
    else if (flag == "--micro-steps") args.micro_steps = std::stoll(value());
    else if (flag == "--strategy") args.strategy = value();
    else if (flag == "--param-dtype") args.param_dtype = value();
    else if (flag == "--device") args.device = value();
    else if (flag == "--cpu-offload") args.cpu_offload = true;
    else if (flag == "--nvme-offload") args.nvme_dir = value();
    else {
      throw std::invalid_argument("unknown option '" + flag + "' (expected --steps N, --micro-steps A, --strategy S, " +
                                  "--param-dtype fp32|bf16|fp16, --device cpu|cuda, --cpu-offload, --nvme-offload DIR)");
    }
  }
  return args;
}

// What fully_shard is asked for: the units, the strategy, the precision, and
// where each unit's shards live between uses.
fsdp::FullyShardOptions shard_options(const Args& args, c10::Device device) {
  fsdp::FullyShardOptions options;
  options.wrap_policy(fsdp::module_type_policy<ResidualBlockImpl>())  // every ResidualBlock a unit
      .strategy(fsdp::parse_enum<fsdp::ShardingStrategy>(args.strategy))
      .mixed_precision(fsdp::MixedPrecision()
                           // gathered and computed in --param-dtype, gradients reduced in fp32
                           .param_dtype(fsdp::parse_enum<torch::ScalarType>(args.param_dtype))
                           .reduce_dtype(torch::kFloat))
      .device(device);  // units move there as they are sharded
  TORCH_CHECK(!args.cpu_offload || args.nvme_dir.empty(), "--cpu-offload or --nvme-offload: one placement, not both");
  if (args.cpu_offload) {  // fp32 shards and the optimizer step in host memory
    options.offload(fsdp::OffloadPolicy::cpu());
  } else if (!args.nvme_dir.empty()) {  // the parameter shards and AdamW's moments on disk
    options.offload(fsdp::OffloadPolicy::nvme(fsdp::NvmeOffloadOptions(args.nvme_dir).optimizer_state(true).params(true)));
  }
  return options;
}

int main(int argc, char** argv) {
  fsdp::MpiEnvironment mpi(&argc, &argv);  // FSDP: one per process
  const int rank = mpi.world()->rank();
  try {
    const Args args = parse_args(argc, argv);
    // The CPU over MPI, or this rank's GPU over NCCL (a world of one: a group of one, no NCCL).
    fsdp::DeviceChoice where = fsdp::choose_device(args.device == "cuda" ? torch::kCUDA : torch::kCPU,
                                                   fsdp::CollectiveBackend::kAuto, mpi.world());
    const auto input_dtype = fsdp::parse_enum<torch::ScalarType>(args.param_dtype);
    torch::manual_seed(1234);
    const torch::Tensor w_true = torch::randn({16}).to(where.device);  // the function to learn, alike on every rank

    torch::manual_seed(0);  // every rank builds the same initial model
    auto model = fsdp::fully_shard(Regressor(/*in=*/16, /*width=*/64, /*depth=*/4), where.group,
                                   shard_options(args, where.device));
    fsdp::FusedAdamW optimizer(model.parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
    fsdp::TrainStep train_step(model, optimizer,
                               fsdp::TrainStepOptions().micro_steps(args.micro_steps).clip_grad_norm(1.0));

    torch::manual_seed(1000 + rank);  // each rank draws its own part of the batch
    double first_loss = 0.0, last_loss = 0.0;
    for (int64_t step = 0; step < args.steps; ++step) {
      fsdp::StepResult result = train_step([&](int64_t micro) {
        torch::Tensor x = torch::randn({32, 16}).to(where.device);
        torch::Tensor y = torch::sin(x.matmul(w_true));
        return model(x.to(input_dtype), y);  // this rank's mean loss of one micro-batch
      });
      if (rank == 0 && step % 10 == 0) std::cout << "step " << step << " loss " << result.loss << "\n";
      last_loss = result.loss;  // the global-batch mean, alike on every rank
      if (step == 0) first_loss = last_loss;
    }
    if (rank == 0) std::cout << "loss " << first_loss << " -> " << last_loss << "\n";
    if (args.steps > 1 && !(last_loss < first_loss)) throw std::runtime_error("the loss did not fall");
  } catch (const std::exception& e) {
    // Every rank fails alike on bad options; the message once, without LibTorch's backtrace.
    if (rank == 0) std::cerr << "example-train-step: " << fsdp::error_message(e) << "\n";
    return 1;
  }
  return 0;
}
