// The reference GPT against its spec (single process): parameter names and
// shapes, the presets' parameter counts, seeded initialization; and the
// next-token loss it shares with the Llama, sliced at hub vocabularies.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "fsdp/gpt.h"
#include "fsdp/memory.h"
#include "plan/estimates.h"
#include "fsdp/wrap_policy.h"
#include "test_helpers.h"
#include "models/loss_slices.h"
#include "core/unit_plan.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::testing::message_of;
using fsdp::testing::tiny;

TEST(GPTSpec, ParameterNamesAndShapes) {
  GPTConfig c = GPTConfig::preset("tiny");
  GPT model(c);
  auto params = fsdp::unique_named_parameters(*model);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : params) shapes[name] = p.sizes().vec();
  const int64_t V = c.vocab, T = c.context, C = c.width;
  std::map<std::string, std::vector<int64_t>> expected = {
      {"transformer.wte.weight", {V, C}}, {"transformer.wpe.weight", {T, C}},
      {"transformer.ln_f.weight", {C}},   {"transformer.ln_f.bias", {C}}};
  for (int i = 0; i < c.layers; ++i) {
    std::string b = "transformer.h." + std::to_string(i) + ".";
    expected[b + "ln_1.weight"] = {C};
    expected[b + "ln_1.bias"] = {C};
    expected[b + "attn.c_attn.weight"] = {3 * C, C};
    expected[b + "attn.c_attn.bias"] = {3 * C};
    expected[b + "attn.c_proj.weight"] = {C, C};
    expected[b + "attn.c_proj.bias"] = {C};
    expected[b + "ln_2.weight"] = {C};
    expected[b + "ln_2.bias"] = {C};
    expected[b + "mlp.c_fc.weight"] = {4 * C, C};
    expected[b + "mlp.c_fc.bias"] = {4 * C};
    expected[b + "mlp.c_proj.weight"] = {C, 4 * C};
    expected[b + "mlp.c_proj.bias"] = {C};
  }
  EXPECT_EQ(shapes, expected);
  // The lm head is the token embedding itself, not a copy.
  EXPECT_TRUE(model->lm_head->weight.is_same(model->transformer->wte->weight));
}

TEST(GPTSpec, PresetParameterCountsMatchTheSpecTable) {
  std::map<std::string, double> millions = {
      {"tiny", 0.12}, {"small", 3.26}, {"medium", 25.5}, {"large", 151.7}, {"xl", 1477.6}};
  for (const auto& [preset, m] : millions) {
    GPTConfig c = GPTConfig::preset(preset);
    const int64_t V = c.vocab, T = c.context, C = c.width, L = c.layers;
    const int64_t formula = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
    if (preset == "tiny" || preset == "small") EXPECT_EQ(GPT(c)->num_parameters(), formula) << preset;
    EXPECT_NEAR(formula / 1e6, m, 0.05 * m) << preset;
  }
  // xl, exactly: GPT-2-XL's body at byte vocabulary.
  const GPTConfig x = GPTConfig::preset("xl");
  const auto xl = fsdp::TransformerShape{x.vocab, x.context, x.layers, x.heads, x.width, x.batch}.unit_numels();
  EXPECT_EQ(xl.size(), 49u);
  EXPECT_EQ(std::accumulate(xl.begin(), xl.end(), int64_t{0}), 1477609600);
  // 3b: xl's depth at width 2,304 (twice this machine's memory in fp32 AdamW state).
  const GPTConfig b = GPTConfig::preset("3b");
  const auto three = fsdp::TransformerShape{b.vocab, b.context, b.layers, b.heads, b.width, b.batch}.unit_numels();
  EXPECT_EQ(std::accumulate(three.begin(), three.end(), int64_t{0}), 3062039040);
  EXPECT_NE(message_of([] { GPTConfig::preset("huge"); }).find("unknown preset 'huge'"), std::string::npos);
}

TEST(GPTSpec, SeededInitializationFollowsTheSpec) {
  GPTConfig c = GPTConfig::preset("small");
  GPT a(c), b(c);
  a->init_weights(42);
  b->init_weights(42);
  for (const auto& [name, p] : fsdp::unique_named_parameters(*a)) {
    EXPECT_TRUE(torch::equal(p, b->named_parameters()[name])) << name;
    if (name.find(".bias") != std::string::npos) {
      EXPECT_EQ(p.abs().max().item<float>(), 0.0f) << name;
    } else if (name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(torch::all(p == 1.0).item<bool>()) << name;
    } else {
      double expected_std = name.find("c_proj.weight") != std::string::npos ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
      EXPECT_NEAR(p.std().item<double>(), expected_std, 0.05 * expected_std) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.1 * expected_std) << name;
    }
  }
  GPT other(c);
  other->init_weights(43);
  EXPECT_FALSE(torch::equal(other->transformer->wte->weight, a->transformer->wte->weight));
}

namespace {

// cross_entropy(linear(hidden, weight)) and the gradients of hidden and
// weight for upstream gradient `scale`: what next_token_loss replaces.
std::vector<torch::Tensor> loss_and_gradients(const torch::Tensor& hidden, const torch::Tensor& weight,
                                              const torch::Tensor& targets, bool sliced, double scale) {
  for (const auto& t : {hidden, weight}) t.mutable_grad() = torch::Tensor();
  torch::Tensor loss;
  if (sliced) {
    loss = fsdp::models::next_token_loss(hidden, weight, targets);
  } else {  // the models' loss before slicing
    const torch::Tensor out = torch::nn::functional::linear(hidden, weight).to(torch::kFloat);
    loss = torch::nn::functional::cross_entropy(out.view({-1, out.size(-1)}), targets.reshape({-1}));
  }
  (loss * scale).backward();
  auto copy = [](const torch::Tensor& grad) { return grad.defined() ? grad.clone() : grad; };
  return {loss.detach(), copy(hidden.grad()), copy(weight.grad())};
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() /
         b.to(torch::kDouble).abs().max().item<double>();
}

}  // namespace

TEST(NextTokenLoss, SlicedEqualsCrossEntropyAndNeverHoldsTheLogits) {
  // A hub-sized vocabulary: 83 rows a slice, so 170 rows take three slices,
  // the last one short; two targets ignored (-100) as cross_entropy does.
  const int64_t V = 100003, C = 16, M = 170;
  ASSERT_EQ(fsdp::models::loss_slice_rows(V), 83);
  torch::manual_seed(3);
  const torch::Tensor hidden = torch::randn({M, C}).requires_grad_();
  const torch::Tensor weight = (torch::randn({V, C}) * 0.3).requires_grad_();
  torch::Tensor targets = torch::randint(V, {M}, torch::kLong);
  targets[5] = -100, targets[160] = -100;
  const auto whole = loss_and_gradients(hidden, weight, targets, false, 0.7);
  fsdp::memory::reset_peaks();
  const int64_t before = fsdp::memory::usage().live_total;
  const auto sliced = loss_and_gradients(hidden, weight, targets, true, 0.7);
  const int64_t peak = fsdp::memory::usage().peak_total - before;
  // Sums over 100,003 logits in another order: float rounding (measured 1.5e-6 at most).
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_LT(relative_error(sliced[i], whole[i]), 1e-5) << "output " << i;
  EXPECT_GT(relative_error(sliced[0], whole[0]) + relative_error(sliced[2], whole[2]), 0) << "it did not slice";
  // Its peak: the head's fp32 gradient accumulator and the weight's
  // gradient (V C each), one slice's logits and gradient, never M V.
  EXPECT_LT(peak, (2 * V * C + 3 * 83 * V) * 4) << "peak " << peak << " B; the whole logits are " << M * V * 4 << " B";
  // Its gradients are computed in forward and handed over once: a second
  // backward through it is refused, not answered with stale numbers.
  torch::Tensor twice = fsdp::models::next_token_loss(hidden, weight, targets);
  twice.backward({}, /*retain_graph=*/true);
  EXPECT_NE(fsdp::testing::message_of([&] { twice.backward(); }).find("retain_graph is not supported"),
            std::string::npos);
  // A frozen head (LoRA's base): no gradient for it, the same for hidden.
  weight.requires_grad_(false);
  const auto frozen = loss_and_gradients(hidden, weight, targets, true, 0.7);
  EXPECT_FALSE(frozen[2].defined());
  EXPECT_TRUE(torch::equal(frozen[1], sliced[1]));
  // bf16 compute: the loss still in fp32, the gradients in bf16's precision.
  const torch::Tensor h16 = hidden.detach().to(torch::kBFloat16).requires_grad_();
  const torch::Tensor w16 = weight.detach().to(torch::kBFloat16).requires_grad_();
  const auto whole16 = loss_and_gradients(h16, w16, targets, false, 1.0);
  const auto sliced16 = loss_and_gradients(h16, w16, targets, true, 1.0);
  EXPECT_EQ(sliced16[0].scalar_type(), torch::kFloat);
  for (size_t i = 0; i < whole16.size(); ++i) EXPECT_LT(relative_error(sliced16[i], whole16[i]), 1e-2) << "bf16 " << i;
}

TEST(NextTokenLoss, OneSliceIsCrossEntropyBitForBit) {
  // The presets' byte vocabulary: every step's rows fit in one slice, and
  // the loss is computed whole, as before slicing (the suite's fixed-seed
  // losses do not move).
  torch::manual_seed(4);
  const torch::Tensor hidden = torch::randn({4, 32, 64}).requires_grad_();
  const torch::Tensor weight = torch::randn({256, 64}).requires_grad_();
  const torch::Tensor targets = torch::randint(256, {4, 32}, torch::kLong);
  const auto whole = loss_and_gradients(hidden, weight, targets, false, 1.0);
  const auto sliced = loss_and_gradients(hidden, weight, targets, true, 1.0);
  EXPECT_TRUE(torch::equal(sliced[0], whole[0]));
  EXPECT_TRUE(torch::equal(sliced[1], whole[1]));
  EXPECT_TRUE(torch::equal(sliced[2], whole[2]));
  EXPECT_THROW(fsdp::models::next_token_loss(hidden, weight.t(), targets), c10::Error);
}
