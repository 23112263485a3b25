#pragma once
// The probe models of the state-machine, prefetch and activation
// checkpointing tests: units that report, from inside their forward and
// their backward, which units are unsharded and how many bytes of unsharded
// buffers are live.

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "fsdp/fully_shard.h"

namespace fsdp::testing {

// The probe models' units (the root's embedding and each block) are one
// Linear(25, 25) each: 650 elements, which pad at W = 3 (to 651) and 4 (to 652).
inline constexpr int64_t kProbeWidth = 25;

// The bytes of one probe unit's gathered fp32 buffer (or full-size gradient
// buffer) at W ranks: its elements padded to a multiple of W, from the spec.
inline int64_t probe_unit_bytes(int W) {
  const int64_t numel = kProbeWidth * kProbeWidth + kProbeWidth;
  return (numel + W - 1) / W * W * 4;
}

// A block that reports, from inside its forward and its backward, which
// units are unsharded and how many bytes of unsharded buffers are live.
struct ProbeBlockImpl : torch::nn::Module {
  using Probe = std::function<void(int index, bool in_backward)>;
  ProbeBlockImpl(int index, int64_t width, Probe probe)
      : index(index), probe(std::move(probe)), fc(register_module("fc", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    probe(index, false);
    torch::Tensor h = fc(x);
    if (h.requires_grad()) {
      auto report = probe;
      int i = index;
      h.register_hook([report, i](const torch::Tensor&) { report(i, true); });
    }
    return x + torch::tanh(h);
  }
  int index;
  Probe probe;
  torch::nn::Linear fc;
};
TORCH_MODULE(ProbeBlock);

struct ProbeNetImpl : torch::nn::Module {
  ProbeNetImpl(int64_t width, int depth, ProbeBlockImpl::Probe probe)
      : embed(register_module("embed", torch::nn::Linear(width, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int i = 0; i < depth; ++i) blocks->push_back(ProbeBlock(i, width, probe));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = embed(x);
    for (const auto& block : *blocks) h = fsdp::unit_forward(*block->as<ProbeBlockImpl>(), h);
    return h.pow(2).mean();
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(ProbeNet);

}  // namespace fsdp::testing
