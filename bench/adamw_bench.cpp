// fsdp-bench-adamw: fsdp::FusedAdamW against torch::optim::AdamW on one
// shard of N float32 elements (what an offloaded or CPU rank steps), and,
// where the LibTorch has it (2.x), against ATen's own fused AdamW on the CPU
// (at::_fused_adamw_: PyTorch's torch.optim.AdamW(fused=True), what a
// PyTorch user's CPU-offloaded step can at best use), in alternating rounds:
// each round times one step of each, in turn, after a warm-up step of each. Prints one JSON object: the median seconds per step
// of each, the speed-up, the bytes each step moves (the fused pass reads
// param, grad and both moments and writes param and both moments: 28 B per
// element), and how far the two parameters are apart after the same steps.
//
//   fsdp-bench-adamw --elements 100000000 --rounds 5 [--threads T]

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "fsdp/fused_adamw.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t elements = 100'000'000;
  int rounds = 5;
  int threads = 0;
  CLI::App app{"fsdp::FusedAdamW against torch::optim::AdamW on one float32 shard, alternating"};
  app.add_option("--elements", elements, "elements of the shard")->capture_default_str();
  app.add_option("--rounds", rounds, "timed steps of each, alternating")->capture_default_str();
  app.add_option("--threads", threads, "LibTorch threads (default: all cores)");
  CLI11_PARSE(app, argc, argv);
  if (elements <= 0 || rounds <= 0) {
    std::cerr << "fsdp-bench-adamw: --elements and --rounds must be positive, got " << elements << " and " << rounds
              << "\n";
    return 2;
  }
  if (threads > 0) torch::set_num_threads(threads);
  torch::manual_seed(0);
  const torch::Tensor initial = torch::randn({elements});
  const torch::Tensor gradient = torch::randn({elements}) * 1e-2;
  const auto options = torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  torch::Tensor fused_param = initial.clone().requires_grad_(true);
  torch::Tensor torch_param = initial.clone().requires_grad_(true);
  torch::Tensor aten_param = initial.clone().requires_grad_(true);
  fused_param.mutable_grad() = gradient.clone();
  torch_param.mutable_grad() = gradient.clone();
  aten_param.mutable_grad() = gradient.clone();
  fsdp::FusedAdamW fused({fused_param}, options);
  torch::optim::AdamW reference({torch_param}, options);
  // FusedAdamW's GPU path, here on the CPU: ATen's multi-tensor kernel.
  fsdp::FusedAdamW aten({aten_param}, options);
  const bool with_aten = fsdp::FusedAdamW::multi_tensor_available();
  using Clock = std::chrono::steady_clock;
  auto time_step = [](torch::optim::Optimizer& optimizer) {
    const auto start = Clock::now();
    optimizer.step();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  auto time_aten_step = [&] {
    const auto start = Clock::now();
    aten.step_multi_tensor();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  time_step(fused);  // warm-up: the moments are allocated here
  time_step(reference);
  if (with_aten) time_aten_step();
  std::vector<double> fused_s, torch_s, aten_s;
  for (int r = 0; r < rounds; ++r) {
    fused_s.push_back(time_step(fused));
    torch_s.push_back(time_step(reference));
    if (with_aten) aten_s.push_back(time_aten_step());
  }
  const double difference =
      ((fused_param - torch_param).norm() / torch_param.norm()).item<double>();  // norm-relative
  const double fused_median = median(fused_s), torch_median = median(torch_s);
  const double bytes = 28.0 * static_cast<double>(elements);
  nlohmann::json result = {{"elements", elements},
                           {"threads", torch::get_num_threads()},
                           {"rounds", rounds},
                           {"steps", rounds + 1},
                           {"fused_s", fused_median},
                           {"torch_s", torch_median},
                           {"speedup", torch_median / fused_median},
                           {"fused_gb_per_s", bytes / fused_median / 1e9},
                           {"fused_all", fused.fuses_all()},
                           {"relative_difference", difference},
                           {"fused_rounds_s", fused_s},
                           {"torch_rounds_s", torch_s}};
  if (with_aten) {
    const double aten_median = median(aten_s);
    result["aten_fused_s"] = aten_median;
    result["speedup_over_aten_fused"] = aten_median / fused_median;
    result["aten_fused_rounds_s"] = aten_s;
    result["aten_relative_difference"] = ((aten_param - torch_param).norm() / torch_param.norm()).item<double>();
  }
  std::cout << result.dump() << "\n";
  return 0;
}
