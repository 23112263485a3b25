// fsdp::lora on one process: which linears apply() adapts and how it names
// them, what it freezes, the forward it computes (PEFT's formula, checked by
// hand), its seeded initialization, a user's own module, and the input it
// refuses; PEFT's adapter_config.json and the merge of --merge-lora. The
// sharded runs are FrozenParameters' (test_frozen.cpp), the PEFT files
// against peft itself tests/hugging_face/lora.sh's.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fsdp/error.h"
#include "fsdp/gpt.h"
#include "fsdp/llama.h"
#include "fsdp/lora.h"
#include "fsdp/model_config.h"
#include "fsdp/peft.h"
#include "fsdp/wrap_policy.h"
#include "test_helpers.h"
#include "state_dict/peft_files.h"
#include "core/unit_plan.h"

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

namespace {

// What a MergingWriter passes on, kept.
struct KeptWriter : fsdp::WeightWriter {
  std::vector<torch::Tensor>* out;
  bool* committed;
  void write(const torch::Tensor& t) override { out->push_back(t.clone()); }
  void commit() override { *committed = true; }
};

}  // namespace

// --merge-lora's writer: W + (alpha / r) B A for an adapted weight, whether
// its adapters come before it (a unit's trainable part, then its frozen
// part) or after; the others passed on in their order, no adapter.
TEST(Lora, MergingWriterMergesAsPeftDoes) {
  namespace peft = fsdp::peft;
  torch::manual_seed(0);
  const torch::Tensor A = torch::randn({2, 4}), B = torch::randn({3, 2}), W = torch::randn({3, 4}),
                      V = torch::randn({3, 4}), b = torch::randn({3});
  const std::vector<lora::AdapterInfo> adapters{{"x.q", 2, 6.0, 0.0}, {"x.v", 2, 6.0, 0.0}};
  const torch::Tensor merged = W + torch::matmul(B, A) * 3.0, merged_v = V + torch::matmul(B, A) * 3.0;
  using Spec = fsdp::safetensors::TensorSpec;
  // Adapters first (x.q), and a weight before its adapters (x.v), a bias between.
  const std::vector<Spec> specs{{"x.q.lora_A.weight", torch::kFloat, {2, 4}}, {"x.q.lora_B.weight", torch::kFloat, {3, 2}},
                                {"x.v.weight", torch::kFloat, {3, 4}},        {"x.q.weight", torch::kFloat, {3, 4}},
                                {"x.q.bias", torch::kFloat, {3}},             {"x.v.lora_A.weight", torch::kFloat, {2, 4}},
                                {"x.v.lora_B.weight", torch::kFloat, {3, 2}}};
  EXPECT_EQ(peft::without_adapters(specs).size(), 3u);
  std::vector<torch::Tensor> out;
  bool committed = false;
  auto inner = std::make_unique<KeptWriter>();
  inner->out = &out, inner->committed = &committed;
  peft::MergingWriter writer(specs, adapters, std::move(inner));
  for (const torch::Tensor& t : {A, B, V, W, b, A}) writer.write(t);
  EXPECT_TRUE(out.empty()) << "x.v waits for its adapters, and what follows it";
  writer.write(B);
  writer.commit();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(committed);
  EXPECT_TRUE(out[0].equal(merged_v));
  EXPECT_TRUE(out[1].equal(merged));
  EXPECT_TRUE(out[2].equal(b));
}

// adapter_config.json as PEFT writes it, read back; PEFT features that the
// adapters here do not have are refused by their key.
TEST(Lora, PeftAdapterConfigReadsBackAndRefusesWhatItCannotDo) {
  namespace peft = fsdp::peft;
  const std::string folder = "/tmp/fsdp_test_peft_config_" + std::to_string(::getpid());
  std::filesystem::create_directories(folder);
  const auto gpt = fsdp::models::ModelConfig(fsdp::testing::tiny());
  const peft::AdapterConfig written =
      peft::adapter_config(gpt, lora::LoraOptions().rank(4).alpha(8).dropout(0.05).targets({"c_attn", "c_proj"}), "base");
  EXPECT_TRUE(written.fan_in_fan_out) << "GPT-2's Conv1D";
  const std::string json = peft::adapter_config_json(written);
  auto write = [&](const std::string& text) { std::ofstream(folder + "/adapter_config.json") << text; };
  write(json);
  const peft::AdapterConfig read = peft::read_adapter_config(folder);
  EXPECT_EQ(read.lora.rank(), 4);
  EXPECT_EQ(read.lora.alpha(), 8.0);
  EXPECT_EQ(read.lora.dropout(), 0.05);
  EXPECT_EQ(read.lora.targets(), (std::vector<std::string>{"c_attn", "c_proj"}));
  EXPECT_EQ(read.base_model, "base");
  EXPECT_NE(json.find("\"lora_alpha\": 8,"), std::string::npos) << "an integral alpha as PEFT writes it: " << json;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"use_dora", "true"}, {"use_rslora", "true"}, {"bias", "\"all\""}, {"modules_to_save", "[\"lm_head\"]"},
           {"rank_pattern", "{\"c_attn\": 8}"}, {"layers_to_transform", "[0]"}, {"target_modules", "\".*c_attn\""}}) {
    std::string changed = json;
    const size_t at = changed.find("\"" + key + "\": ");
    ASSERT_NE(at, std::string::npos) << key;
    const size_t begin = at + key.size() + 4, end = changed.find_first_of(",\n", begin);
    const size_t stop = key == "target_modules" ? changed.find(']', begin) + 1 : end;
    changed.replace(begin, stop - begin, value);
    write(changed);
    EXPECT_NE(refusal([&] { peft::read_adapter_config(folder); }).find("\"" + key + "\""), std::string::npos) << key;
  }
  std::filesystem::remove_all(folder);
}
