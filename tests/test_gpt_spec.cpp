// The reference GPT against its spec (single process): parameter names and
// shapes, the presets' parameter counts, seeded initialization.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "fsdp/gpt.h"
#include "fsdp/memory_plan.h"
#include "fsdp/wrap_policy.h"
#include "test_helpers.h"

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
