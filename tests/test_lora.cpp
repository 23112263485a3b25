// fsdp::lora on one process: which linears apply() adapts and how it names
// them, what it freezes, the forward it computes (PEFT's formula, checked by
// hand), its seeded initialization, a user's own module, and the input it
// refuses. The sharded runs are FrozenParameters' (test_frozen.cpp), the
// PEFT files tests/hugging_face's.

#include <gtest/gtest.h>

#include "fsdp/error.h"
#include "fsdp/gpt.h"
#include "fsdp/llama.h"
#include "fsdp/lora.h"
#include "fsdp/wrap_policy.h"
#include "test_helpers.h"

namespace {

namespace lora = fsdp::lora;

// A user's own module: two linears, the adapted one called through lora::forward.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return lora::forward(fc2, torch::relu(lora::forward(fc1, x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TwoLayer);

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return fsdp::error_message(e);
  }
  return "accepted";
}

}  // namespace

// apply() on the GPT: the named linears gain PEFT's names, everything else
// is frozen, B starts at zero so the logits are the base model's, and after
// B moves the forward is PEFT's base + (alpha / r) B A x.
TEST(Lora, AdaptsTheNamedLinearsAsPeftNamesThem) {
  fsdp::models::GPT model = fsdp::testing::make_gpt(fsdp::testing::tiny());
  const torch::Tensor idx = torch::randint(0, 256, {2, 8}, torch::kLong);
  const torch::Tensor before = model->logits(idx).detach();
  const auto report = lora::apply(*model, lora::LoraOptions().rank(4).alpha(8).targets({"c_attn", "c_proj"}));
  // Both blocks' c_attn, attention's and the MLP's c_proj (PEFT's suffix match).
  ASSERT_EQ(report.adapted.size(), 6u);
  EXPECT_EQ(report.adapted[0], "transformer.h.0.attn.c_attn");
  EXPECT_EQ(report.adapted[1], "transformer.h.0.attn.c_proj");
  EXPECT_EQ(report.adapted[2], "transformer.h.0.mlp.c_proj");
  int64_t trainable = 0, total = 0;
  for (const auto& [name, param] : fsdp::unique_named_parameters(*model)) {
    total += param.numel();
    EXPECT_EQ(param.requires_grad(), lora::is_adapter_parameter(name)) << name;
    if (param.requires_grad()) trainable += param.numel();
  }
  const int64_t C = 64;  // the tiny GPT's width: c_attn 64 -> 192, c_proj 64 -> 64 and 256 -> 64
  EXPECT_EQ(trainable, 2 * 4 * ((C + 3 * C) + (C + C) + (4 * C + C)));
  EXPECT_EQ(report.trainable, trainable);
  EXPECT_EQ(report.parameters, total);
  const auto params = model->named_parameters();
  EXPECT_EQ(params["transformer.h.1.attn.c_attn.lora_A.weight"].sizes(), torch::IntArrayRef({4, C}));
  EXPECT_EQ(params["transformer.h.1.attn.c_attn.lora_B.weight"].sizes(), torch::IntArrayRef({3 * C, 4}));
  EXPECT_TRUE(torch::equal(model->logits(idx), before)) << "B starts at zero: the base model's logits";

  // With B moved, one adapted linear by hand.
  torch::NoGradGuard no_grad;
  auto attn = model->transformer->h[0]->as<fsdp::models::BlockImpl>()->attn;
  torch::Tensor a = params["transformer.h.0.attn.c_attn.lora_A.weight"];
  torch::Tensor b = params["transformer.h.0.attn.c_attn.lora_B.weight"];
  b.normal_();
  const torch::Tensor x = torch::randn({2, 8, C});
  const torch::Tensor base = torch::nn::functional::linear(x, params["transformer.h.0.attn.c_attn.weight"],
                                                           params["transformer.h.0.attn.c_attn.bias"]);
  const torch::Tensor expected = base + torch::matmul(torch::matmul(x, a.t()), b.t()) * (8.0 / 4.0);
  EXPECT_LT((lora::forward(attn->c_attn, x) - expected).abs().max().item<double>(), 1e-5);
  EXPECT_FALSE(torch::equal(model->logits(idx), before));

  // Calling the adapted linear directly would leave the adapter out: it fails.
  EXPECT_NE(refusal([&] { attn->c_attn(x); }), "accepted");
  const auto found = lora::adapters(*model);
  ASSERT_EQ(found.size(), 6u);
  EXPECT_EQ(found[0].linear, "transformer.h.0.attn.c_attn");
  EXPECT_EQ(found[0].rank, 4);
  EXPECT_DOUBLE_EQ(found[0].scaling(), 2.0);
}

// A's values depend on the seed and the parameter's name only (so sharded
// initialization and every world size draw the same); dropout acts in
// training only; "all-linear" leaves the Llama's output head alone; a
// user's own module works through lora::forward.
TEST(Lora, InitializationDropoutAllLinearAndAUsersModule) {
  torch::Tensor a1 = torch::empty({4, 16}), a2 = torch::empty({4, 16}), a3 = torch::empty({4, 16});
  lora::init_parameter("x.q_proj.lora_A.weight", a1, 7);
  lora::init_parameter("x.q_proj.lora_A.weight", a2, 7);
  lora::init_parameter("x.k_proj.lora_A.weight", a3, 7);
  EXPECT_TRUE(torch::equal(a1, a2));
  EXPECT_FALSE(torch::equal(a1, a3));
  EXPECT_LE(a1.abs().max().item<double>(), 0.25);  // 1 / sqrt(16)
  torch::Tensor b = torch::ones({16, 4});
  lora::init_parameter("x.q_proj.lora_B.weight", b, 7);
  EXPECT_EQ(b.abs().sum().item<double>(), 0.0);

  fsdp::models::LlamaConfig config;
  config.vocab = 64, config.context = 16, config.layers = 2, config.heads = 4, config.kv_heads = 2, config.width = 32,
  config.hidden = 48, config.batch = 2;
  fsdp::models::Llama llama(config);
  const auto report = lora::apply(*llama, lora::LoraOptions().rank(2).targets({"all-linear"}));
  EXPECT_EQ(report.adapted.size(), 2u * 7u);  // q, k, v, o, gate, up, down per layer; not lm_head
  for (const auto& name : report.adapted) EXPECT_EQ(name.find("lm_head"), std::string::npos) << name;
  const torch::Tensor idx = torch::randint(0, 64, {2, 8}, torch::kLong);
  EXPECT_EQ(llama->logits(idx).sizes(), torch::IntArrayRef({2, 8, 64}));

  TwoLayer mine;
  lora::apply(*mine, lora::LoraOptions().rank(2).alpha(4).dropout(0.5).targets({"fc1"}));
  for (auto& [name, param] : fsdp::unique_named_parameters(*mine)) {
    if (lora::is_adapter_parameter(name)) {
      torch::NoGradGuard no_grad;
      param.normal_();
    }
  }
  const torch::Tensor x = torch::randn({8, 6});
  mine->eval();
  const torch::Tensor evaluated = mine->forward(x);
  EXPECT_TRUE(torch::equal(mine->forward(x), evaluated)) << "no dropout in eval()";
  mine->train();
  EXPECT_FALSE(torch::equal(mine->forward(x), evaluated)) << "dropout on the adapter's input in train()";
  // The gradients reach the adapters only.
  mine->forward(x).sum().backward();
  for (const auto& [name, param] : fsdp::unique_named_parameters(*mine)) {
    EXPECT_EQ(param.grad().defined(), lora::is_adapter_parameter(name)) << name;
  }
}

// Bad input is refused before anything changes, naming what was expected.
TEST(Lora, RefusesWhatItCannotAdapt) {
  auto fresh = [] { return fsdp::testing::make_gpt(fsdp::testing::tiny()); };
  auto gpt = fresh();
  EXPECT_NE(refusal([&] { lora::apply(*gpt, lora::LoraOptions().targets({"q_proj"})); }).find("names no module"),
            std::string::npos);
  EXPECT_TRUE(gpt->parameters()[0].requires_grad()) << "nothing frozen by a refused apply";
  EXPECT_NE(refusal([&] { lora::apply(*gpt, lora::LoraOptions().targets({"ln_1"})); }).find("not a torch::nn::Linear"),
            std::string::npos);
  EXPECT_NE(refusal([&] { lora::apply(*gpt, lora::LoraOptions().rank(0).targets({"c_attn"})); }).find("rank"),
            std::string::npos);
  EXPECT_NE(refusal([&] { lora::apply(*gpt, lora::LoraOptions().dropout(1).targets({"c_attn"})); }).find("dropout"),
            std::string::npos);
  lora::apply(*gpt, lora::LoraOptions().targets({"c_attn"}));
  EXPECT_NE(refusal([&] { lora::apply(*gpt, lora::LoraOptions().targets({"c_fc"})); }).find("adapters already"),
            std::string::npos);
}
