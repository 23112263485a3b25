// fsdp::causal_attention on one process: the fused kernel (LibTorch 2.x)
// against the written-out path, forward and gradients, on the suite's shapes
// and with grouped-query heads; the written-out path against the formula;
// whole models with each kernel; and what a LibTorch without the kernel
// refuses. The W-equivalence of sharded runs needs no test of its own here:
// every rank, and the single process it is compared with, runs one kernel.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>

#include "fsdp/attention.h"
#include "fsdp/gpt.h"
#include "fsdp/llama.h"
#include "test_helpers.h"
#include "models/attention_kernel.h"

namespace {

using fsdp::AttentionKernel;

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() /
         b.to(torch::kDouble).abs().max().item<double>();
}

struct Qkv {
  torch::Tensor q, k, v;
};
Qkv random_qkv(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t d, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({B, H, T, d}).requires_grad_(), torch::randn({B, Hkv, T, d}).requires_grad_(),
          torch::randn({B, Hkv, T, d}).requires_grad_()};
}

// The output and the three inputs' gradients for a fixed upstream gradient.
std::vector<torch::Tensor> run(const Qkv& in, AttentionKernel kernel, bool softmax_in_float) {
  for (const auto& t : {in.q, in.k, in.v}) t.mutable_grad() = torch::Tensor();
  torch::Tensor y = fsdp::causal_attention(in.q, in.k, in.v, kernel, softmax_in_float);
  torch::manual_seed(7);
  (y * torch::randn(y.sizes())).sum().backward();
  return {y.detach(), in.q.grad(), in.k.grad(), in.v.grad()};
}

TEST(Attention, WrittenOutIsTheFormula) {
  // The GPT's inline formula of before (shared/spec/gpt.md), here written
  // again: the written-out path equals it bit for bit, so 1.13's numbers stay.
  const Qkv in = random_qkv(2, 4, 4, 8, 16, 1);
  const int64_t T = 8;
  torch::Tensor scores = torch::matmul(in.q, in.k.transpose(-2, -1)) * (1.0 / std::sqrt(16.0));
  scores = scores.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -std::numeric_limits<float>::infinity());
  const torch::Tensor expected = torch::matmul(torch::softmax(scores, -1), in.v);
  EXPECT_TRUE(torch::equal(fsdp::causal_attention(in.q, in.k, in.v, AttentionKernel::kWrittenOut, false), expected));
  // Grouped-query heads: query head h reads key-value head h / 2.
  const Qkv g = random_qkv(1, 4, 2, 8, 16, 2);
  const torch::Tensor grouped = fsdp::causal_attention(g.q, g.k, g.v, AttentionKernel::kWrittenOut, true);
  const torch::Tensor repeated = fsdp::causal_attention(g.q, g.k.repeat_interleave(2, 1), g.v.repeat_interleave(2, 1),
                                                        AttentionKernel::kWrittenOut, true);
  EXPECT_TRUE(torch::equal(grouped, repeated));
}

TEST(Attention, FusedEqualsWrittenOutWithin1e6) {
  if (!fsdp::fused_attention_available()) {
    // 1.13: auto is written out, and the fused kernel is refused by name.
    EXPECT_EQ(fsdp::resolve_attention(AttentionKernel::kAuto), AttentionKernel::kWrittenOut);
    const std::string error = fsdp::testing::message_of([] { fsdp::resolve_attention(AttentionKernel::kFused); });
    EXPECT_NE(error.find("needs LibTorch 2.0 or later; this one is 1."), std::string::npos) << error;
    GTEST_SKIP() << "this LibTorch has no scaled_dot_product_attention";
  }
  EXPECT_EQ(fsdp::resolve_attention(AttentionKernel::kAuto), AttentionKernel::kFused);
  // The suite's shapes: the GPT's tiny and small heads, the Llama's grouped
  // ones (heads / 2 key-value heads) and a Qwen3-style head_dim of 24.
  struct Shape {
    int64_t B, H, Hkv, T, d;
  };
  double worst = 0;
  for (const Shape s : {Shape{4, 4, 4, 32, 16}, Shape{2, 8, 8, 128, 32}, Shape{2, 4, 2, 64, 16},
                        Shape{2, 4, 2, 128, 24}, Shape{1, 12, 12, 256, 64}}) {
    const Qkv in = random_qkv(s.B, s.H, s.Hkv, s.T, s.d, 3);
    const auto written = run(in, AttentionKernel::kWrittenOut, true);
    const auto fused = run(in, AttentionKernel::kFused, true);
    const char* what[] = {"output", "q's gradient", "k's gradient", "v's gradient"};
    for (size_t i = 0; i < written.size(); ++i) {
      worst = std::max(worst, relative(fused[i], written[i]));
      EXPECT_LT(relative(fused[i], written[i]), 1e-6)
          << what[i] << " at B " << s.B << " H " << s.H << " Hkv " << s.Hkv << " T " << s.T << " d " << s.d;
    }
  }
  std::cout << "worst relative difference, fused against written out: " << worst << "\n";
  EXPECT_GT(worst, 0) << "the two paths gave the same bits: is the fused kernel called at all?";
  // The banner names LibTorch's choice: flash on a CPU, for fp32 and bf16.
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string d = fsdp::describe_attention(AttentionKernel::kAuto, torch::dtype(dtype), 4, 2, 16);
    EXPECT_NE(d.find("scaled_dot_product_attention (flash, LibTorch 2."), std::string::npos) << d;
  }
}

TEST(Attention, ModelsComputeEitherKernel) {
  // A model's loss with either kernel: the same to fp32 rounding on 2.x; on
  // 1.13, kAuto is the written-out path.
  const AttentionKernel other = fsdp::fused_attention_available() ? AttentionKernel::kFused : AttentionKernel::kAuto;
  torch::manual_seed(5);
  const torch::Tensor idx = torch::randint(0, 256, {2, 32}), targets = torch::randint(0, 256, {2, 32});
  for (int family = 0; family < 2; ++family) {
    std::shared_ptr<fsdp::models::LanguageModel> written, fused;
    if (family == 0) {
      fsdp::models::GPTConfig c;
      c.attention = AttentionKernel::kWrittenOut;
      written = fsdp::models::GPT(c).ptr();
      c.attention = other;
      fused = fsdp::models::GPT(c).ptr();
    } else {
      fsdp::models::LlamaConfig c;
      c.attention = AttentionKernel::kWrittenOut;
      written = fsdp::models::Llama(c).ptr();
      c.attention = other;
      fused = fsdp::models::Llama(c).ptr();
    }
    written->init_weights(11);
    fused->init_weights(11);
    const double a = written->forward(idx, targets).item<double>(), b = fused->forward(idx, targets).item<double>();
    EXPECT_LT(std::abs(a - b) / std::abs(a), 1e-6) << (family == 0 ? "GPT" : "Llama") << ": " << a << " vs " << b;
    std::cout << std::setprecision(17) << (family == 0 ? "GPT" : "Llama") << " loss, written out " << a << ", " << fsdp::enum_name(other) << " " << b << "\n";
  }
}

}  // namespace
