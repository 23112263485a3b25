// The Llama (fsdp/llama.h) in one process: Hugging Face LlamaForCausalLM's
// parameter names and shapes, the presets, the seeded initialization, the
// wrap policy's units, and the forward against a reference written out
// here in double precision (rotation of channel pairs, attention head by
// head). That it equals transformers' own is the Hugging Face cases'.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "fsdp/gpt.h"
#include "fsdp/hugging_face.h"
#include "fsdp/llama.h"
#include "fsdp/wrap_policy.h"
#include "test_helpers.h"
#include "models/attention_kernel.h"
#include "core/unit_plan.h"

namespace llama_test {

using fsdp::models::Llama;
using fsdp::models::LlamaConfig;

LlamaConfig small_config() {
  LlamaConfig c;
  c.vocab = 32, c.context = 8, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 16, c.hidden = 40;
  c.rope_theta = 500.0, c.norm_eps = 1e-6, c.batch = 2;
  return c;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + eps) * w;
}

// Channel i and i + hs/2 of position t turned by t * theta^(-2i/hs). x: [T, hs].
torch::Tensor rotate_pairs(const torch::Tensor& x, double theta) {
  const int64_t T = x.size(0), half = x.size(1) / 2;
  torch::Tensor out = torch::empty_like(x);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = t * std::pow(theta, -2.0 * i / (2 * half));
      const double a = x[t][i].item<double>(), b = x[t][i + half].item<double>();
      out[t][i] = a * std::cos(angle) - b * std::sin(angle);
      out[t][i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
  return out;
}

// One sequence's decoder layer; p(name) is the layer's parameter in double.
torch::Tensor layer(const torch::Tensor& x, const LlamaConfig& c, const std::function<torch::Tensor(std::string)>& p) {
  const int64_t T = x.size(0), hs = c.head_dim();
  torch::Tensor h = rms_norm(x, p("input_layernorm.weight"), c.norm_eps);
  torch::Tensor q = h.matmul(p("self_attn.q_proj.weight").t()), k = h.matmul(p("self_attn.k_proj.weight").t());
  torch::Tensor v = h.matmul(p("self_attn.v_proj.weight").t());
  std::vector<torch::Tensor> heads;
  for (int64_t head = 0; head < c.heads; ++head) {
    const int64_t kv = head / (c.heads / c.kv_heads);  // grouped-query: heads share kv heads in groups
    torch::Tensor qh = rotate_pairs(q.narrow(1, head * hs, hs), c.rope_theta);
    torch::Tensor kh = rotate_pairs(k.narrow(1, kv * hs, hs), c.rope_theta), vh = v.narrow(1, kv * hs, hs);
    torch::Tensor scores = qh.matmul(kh.t()) / std::sqrt(static_cast<double>(hs));
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = i + 1; j < T; ++j) scores[i][j] = -INFINITY;
    }
    heads.push_back(torch::softmax(scores, -1).matmul(vh));
  }
  torch::Tensor y = x + torch::cat(heads, 1).matmul(p("self_attn.o_proj.weight").t());
  h = rms_norm(y, p("post_attention_layernorm.weight"), c.norm_eps);
  torch::Tensor gate = h.matmul(p("mlp.gate_proj.weight").t()), up = h.matmul(p("mlp.up_proj.weight").t());
  return y + (gate / (1 + torch::exp(-gate)) * up).matmul(p("mlp.down_proj.weight").t());
}

// The logits of one sequence of token ids, [T, vocab], in double.
torch::Tensor reference_logits(Llama& model, const torch::Tensor& ids) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& [name, t] : fsdp::unique_named_parameters(*model)) params[name] = t.detach().to(torch::kDouble);
  const LlamaConfig& c = model->config();
  torch::Tensor x = params["model.embed_tokens.weight"].index_select(0, ids);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    x = layer(x, c, [&](const std::string& name) { return params.at(prefix + name); });
  }
  return rms_norm(x, params["model.norm.weight"], c.norm_eps).matmul(params["lm_head.weight"].t());
}

}  // namespace llama_test

using llama_test::small_config;
using fsdp::models::Llama;
using fsdp::models::LlamaConfig;

TEST(LlamaModel, ParameterNamesAndShapesAreHuggingFaces) {
  const LlamaConfig c = small_config();
  Llama model(c);
  std::map<std::string, std::vector<int64_t>> shapes, expected = {{"model.embed_tokens.weight", {32, 16}},
                                                                  {"model.norm.weight", {16}},
                                                                  {"lm_head.weight", {32, 16}}};
  for (const auto& [name, p] : fsdp::unique_named_parameters(*model)) shapes[name] = p.sizes().vec();
  for (int i = 0; i < c.layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    expected[l + "input_layernorm.weight"] = {16};
    expected[l + "self_attn.q_proj.weight"] = {16, 16};  // heads x head_dim rows
    expected[l + "self_attn.k_proj.weight"] = {8, 16};   // kv_heads x head_dim
    expected[l + "self_attn.v_proj.weight"] = {8, 16};
    expected[l + "self_attn.o_proj.weight"] = {16, 16};
    expected[l + "post_attention_layernorm.weight"] = {16};
    expected[l + "mlp.gate_proj.weight"] = {40, 16};
    expected[l + "mlp.up_proj.weight"] = {40, 16};
    expected[l + "mlp.down_proj.weight"] = {16, 40};
  }
  EXPECT_EQ(shapes, expected);
  EXPECT_FALSE(model->lm_head->weight.is_same(model->model->embed_tokens->weight));  // untied
  EXPECT_EQ(model->model_type(), "llama");
}

TEST(LlamaModel, ForwardEqualsAHandComputedReference) {
  Llama model(small_config());
  model->init_weights(7);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    if (p.dim() == 1) p.uniform_(0.5, 1.5);  // gains other than one: the norms' weights count
  }
  torch::manual_seed(3);
  torch::Tensor idx = torch::randint(32, {2, 7}, torch::kLong), targets = torch::randint(32, {2, 7}, torch::kLong);
  torch::Tensor logits = model->logits(idx);
  ASSERT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 7, 32}));
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < 2; ++b) {
    torch::Tensor want = llama_test::reference_logits(model, idx[b]);
    EXPECT_TRUE(torch::allclose(logits[b].to(torch::kDouble), want, 1e-5, 1e-5))
        << "sequence " << b << ": largest difference " << (logits[b].to(torch::kDouble) - want).abs().max().item<double>();
    rows.push_back(want);
  }
  torch::Tensor want = torch::stack(rows).view({-1, 32});
  const double loss = torch::nn::functional::cross_entropy(want, targets.view({-1})).item<double>();
  EXPECT_NEAR(model->forward(idx, targets).item<double>(), loss, 1e-5);
}

TEST(LlamaModel, InitializationIsSeededAndHuggingFaces) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  Llama a(c), b(c);
  a->init_weights(1337);
  b->init_weights(1337);
  const auto b_params = b->named_parameters();
  for (const auto& [name, p] : fsdp::unique_named_parameters(*a)) {
    EXPECT_TRUE(torch::equal(p, b_params[name])) << name;
    if (name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
    } else {
      EXPECT_NEAR(p.std().item().toDouble(), 0.02, 0.002) << name;  // N(0, 0.02): o_proj and down_proj too
    }
  }
  EXPECT_EQ(a->num_parameters(), 2 * 256 * 64 + 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192 + 2 * 64));
}

TEST(LlamaModel, PresetsAndValidation) {
  for (const std::string name : {"tiny", "small", "medium", "large", "xl", "3b"}) {
    const LlamaConfig c = LlamaConfig::preset(name);
    const auto gpt = fsdp::models::GPTConfig::preset(name);
    EXPECT_EQ(c.describe().find("vocab " + std::to_string(gpt.vocab) + ", context " + std::to_string(gpt.context)), 0u);
    EXPECT_EQ(c.width, gpt.width);
    EXPECT_EQ(c.heads % c.kv_heads, 0) << name;
    EXPECT_EQ(c.hidden % 32, 0) << name;
    c.validate();
  }
  EXPECT_EQ(LlamaConfig::default_hidden(64), 192);
  LlamaConfig c = small_config();
  c.kv_heads = 3;
  EXPECT_NE(fsdp::testing::message_of([&] { c.validate(); }).find("must be a multiple of kv_heads (3)"), std::string::npos);
  c = small_config();
  c.heads = 16;  // head_dim 1: nothing to rotate in pairs
  c.kv_heads = 16;
  EXPECT_NE(fsdp::testing::message_of([&] { c.validate(); }).find("must be even"), std::string::npos);
  EXPECT_NE(fsdp::testing::message_of([] { LlamaConfig::preset("huge"); }).find("unknown preset 'huge'"),
            std::string::npos);
}

TEST(LlamaModel, WrapPoliciesMakeAUnitPerDecoderLayerOrSublayer) {
  using namespace fsdp::models;
  Llama model(small_config());
  EXPECT_EQ(fsdp::plan_units(*model, fsdp::module_type_policy<LlamaDecoderLayerImpl>()).size(), 3u);
  EXPECT_EQ(fsdp::plan_units(*model, fsdp::module_type_policy<LlamaAttentionImpl, LlamaMLPImpl>()).size(), 5u);
}

// The planner's description (plan_description, what fsdp-plan and the
// preflight plan before any tensor exists) is the model fully_shard shards:
// the same units of the same sizes, for either wrap; the reference GPT's too.
TEST(LlamaModel, PlanDescriptionHasTheModelsUnits) {
  using namespace fsdp::models;
  auto numels = [](torch::nn::Module& model, const fsdp::WrapPolicy& policy) {
    std::vector<int64_t> units;
    for (const auto& plan : fsdp::plan_units(model, policy)) {
      int64_t n = 0;
      for (const auto& p : plan.params) n += p.second.numel();
      units.push_back(n);
    }
    return units;
  };
  Llama llama(small_config());
  const fsdp::ModelDescription d = llama->plan_description();
  EXPECT_EQ(d.layer_units, numels(*llama, fsdp::module_type_policy<LlamaDecoderLayerImpl>()));
  EXPECT_EQ(d.sublayer_units, numels(*llama, fsdp::module_type_policy<LlamaAttentionImpl, LlamaMLPImpl>()));
  EXPECT_EQ(d.num_parameters(), llama->num_parameters());
  // 9 C; with fused attention (LibTorch 2.x) less the k and v repeated to the query heads' width.
  const LlamaConfig c = small_config();
  const int64_t repeated_kv = 2 * (c.heads - c.kv_heads) * c.head_dim();
  EXPECT_EQ(d.shape.extra_layer_activations,
            9 * c.width - (fsdp::fused_attention_available() ? repeated_kv : 0));
  EXPECT_EQ(d.shape.attention_saves_probabilities, !fsdp::fused_attention_available());
  // The hub families' switches change the units' sizes: the description follows.
  LlamaConfig switched = small_config();
  switched.tie_word_embeddings = switched.qkv_bias = switched.attention_bias = switched.qk_norm = true;
  switched.fused_projections = true;
  switched.explicit_head_dim = 2 * switched.head_dim();
  Llama qwen_like(switched);
  const fsdp::ModelDescription q = qwen_like->plan_description();
  EXPECT_EQ(q.layer_units, numels(*qwen_like, fsdp::module_type_policy<LlamaDecoderLayerImpl>()));
  EXPECT_EQ(q.sublayer_units, numels(*qwen_like, fsdp::module_type_policy<LlamaAttentionImpl, LlamaMLPImpl>()));
  EXPECT_EQ(q.num_parameters(), qwen_like->num_parameters());
  GPT gpt(GPTConfig::preset("tiny"));
  const fsdp::ModelDescription g = gpt->plan_description();
  EXPECT_EQ(g.layer_units, numels(*gpt, fsdp::module_type_policy<BlockImpl>()));
  EXPECT_EQ(g.sublayer_units, numels(*gpt, fsdp::module_type_policy<AttentionImpl, MLPImpl>()));
  EXPECT_EQ(g.num_parameters(), gpt->num_parameters());
  EXPECT_EQ(g.shape.extra_layer_activations, 0);
}

const char* fsdp_test_fixtures();

// The config.json files of the hub's models as they ship them
// (tests/fixtures/hub_configs/), read into the Llama's switches: the plan's
// parameter count is transformers' own (its model of each config, counted
// on the meta device with transformers 5.25).
TEST(LlamaModel, TheHubsConfigsAsShippedPlanTheirParameterCounts) {
  namespace hf = fsdp::hugging_face;
  struct Shipped {
    const char* file;
    int64_t parameters;
  };
  const std::string folder = std::string(fsdp_test_fixtures()) + "/hub_configs/";
  for (const Shipped& s : {Shipped{"llama-3.2-1b.json", 1235814400}, Shipped{"mistral-7b-v0.3.json", 7248023552},
                           Shipped{"phi-3-mini-4k.json", 3821079552}, Shipped{"qwen2.5-0.5b.json", 494032768},
                           Shipped{"qwen3-0.6b.json", 596049920}, Shipped{"smollm2-135m.json", 134515008},
                           Shipped{"tinyllama-1.1b.json", 1100048384}, Shipped{"llama-3.1-8b.json", 8030261248}}) {
    const LlamaConfig c = hf::read_config(folder + s.file).model.llama();
    EXPECT_EQ(c.plan_description().num_parameters(), s.parameters) << s.file << ": " << c.describe();
  }
  const LlamaConfig llama32 = hf::read_config(folder + "llama-3.2-1b.json").model.llama();
  EXPECT_TRUE(llama32.tie_word_embeddings);
  EXPECT_EQ(llama32.rope_scaling.kind, fsdp::models::RopeScaling::Kind::kLlama3);
  EXPECT_EQ(llama32.rope_scaling.factor, 32.0);
  const LlamaConfig qwen25 = hf::read_config(folder + "qwen2.5-0.5b.json").model.llama();
  EXPECT_TRUE(qwen25.qkv_bias && qwen25.tie_word_embeddings && !qwen25.attention_bias);
  EXPECT_EQ(qwen25.sliding_window, 0) << "use_sliding_window is false";
  const LlamaConfig qwen3 = hf::read_config(folder + "qwen3-0.6b.json").model.llama();
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim(), 128);
  const LlamaConfig phi3 = hf::read_config(folder + "phi-3-mini-4k.json").model.llama();
  EXPECT_TRUE(phi3.fused_projections);
  EXPECT_EQ(phi3.sliding_window, 2047);
  // Phi-3 mini 128k's longrope, and Phi-3.5's partial rotation, refused by name.
  std::ifstream in(folder + "phi-3-mini-4k.json");
  const std::string shipped((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string null_scaling = "\"rope_scaling\": null";
  for (const auto& [change, refusal] : std::vector<std::pair<std::string, std::string>>{
           {"\"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1.0], \"short_factor\": [1.0]}",
            "rope scaling of type \"longrope\" is not supported"},
           {null_scaling + ", \"partial_rotary_factor\": 0.75", "\"partial_rotary_factor\" is 0.75"}}) {
    std::string text = shipped;
    text.replace(text.find(null_scaling), null_scaling.size(), change);
    const std::string path = ::testing::TempDir() + "phi3-changed.json";
    std::ofstream(path) << text;
    const std::string message = fsdp::testing::message_of([&] { hf::read_config(path); });
    EXPECT_NE(message.find(refusal), std::string::npos) << message;
  }
}

// tie_word_embeddings: the head's weight is the embedding's tensor itself
// (one parameter, counted and initialized once), and a wrap policy that would
// put the two registrations in different units is refused by identity.
TEST(LlamaModel, ATiedHeadIsTheEmbeddingAndAPolicyThatSplitsItIsRefused) {
  using fsdp::models::Llama;
  using fsdp::models::LlamaConfig;
  LlamaConfig c = small_config();
  c.tie_word_embeddings = true;
  Llama tied(c);
  ASSERT_TRUE(tied->tied_lm_head);
  EXPECT_FALSE(tied->lm_head);
  EXPECT_TRUE(tied->tied_lm_head->weight.is_same(tied->model->embed_tokens->weight));
  EXPECT_EQ(tied->num_parameters(), Llama(small_config())->num_parameters() - c.vocab * c.width);
  const std::string message = fsdp::testing::message_of(
      [&] { fsdp::plan_units(*tied, fsdp::module_type_policy<torch::nn::EmbeddingImpl>()); });
  EXPECT_NE(message.find("splits a tied parameter"), std::string::npos) << message;
  EXPECT_NE(message.find("'lm_head.weight'"), std::string::npos) << message;
  // Untied, the same policy is fine: the refusal is the tie's.
  Llama untied(small_config());
  EXPECT_NO_THROW(fsdp::plan_units(*untied, fsdp::module_type_policy<torch::nn::EmbeddingImpl>()));
}
