// The reference GPT's Hugging Face adapter (hugging_face_adapter.h): GPT-2
// (GPT2LMHeadModel). The spec's GPT has GPT-2's names under the
// `transformer.` prefix (hub files name them without it: both are read);
// GPT-2's Conv1D layers keep their weights as [in, out], the spec's Linear as
// [out, in]; the head is tied to the token embedding, so the files hold no
// lm_head.weight.

#include <cmath>

#include "models/hugging_face_adapter.h"

namespace fsdp::hugging_face::detail {
namespace {

using nlohmann::json;

const char* kTransformerPrefix = "transformer.";

class Gpt2Adapter : public Adapter {
 public:
  models::ModelKind kind() const override { return models::ModelKind::kGpt; }
  std::vector<std::string> model_types() const override { return {"gpt2"}; }

  models::ModelConfig read_config(const json& c, const std::string& path,
                                  std::vector<std::string>& ignored) const override {
    models::GPTConfig g;
    g.vocab = field<int64_t>(c, path, "vocab_size", int64_t{50257});
    g.context = field<int64_t>(c, path, "n_positions", int64_t{1024});
    g.layers = field<int64_t>(c, path, "n_layer", int64_t{12});
    g.heads = field<int64_t>(c, path, "n_head", int64_t{12});
    g.width = field<int64_t>(c, path, "n_embd", int64_t{768});
    const auto activation = field<std::string>(c, path, "activation_function", std::string("gelu_new"));
    TORCH_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", "'", path,
                "': \"activation_function\" is \"", activation,
                "\"; the model has GELU's tanh form only (gelu_new or gelu_pytorch_tanh)");
    const double eps = field<double>(c, path, "layer_norm_epsilon", 1e-5);
    TORCH_CHECK(std::abs(eps - 1e-5) <= 1e-12, "'", path, "': \"layer_norm_epsilon\" is ", eps,
                "; the model's LayerNorm epsilon is 1e-05");
    const int64_t inner = field<int64_t>(c, path, "n_inner", 4 * g.width);
    TORCH_CHECK(inner == 4 * g.width, "'", path, "': \"n_inner\" is ", inner, "; the model's MLP is 4 x n_embd = ",
                4 * g.width);
    TORCH_CHECK(field<bool>(c, path, "tie_word_embeddings", true), "'", path,
                "': \"tie_word_embeddings\" is false; the model's head is tied to the token embedding");
    TORCH_CHECK(field<bool>(c, path, "scale_attn_weights", true), "'", path,
                "': \"scale_attn_weights\" is false; the model scales attention by 1 / sqrt(head size)");
    TORCH_CHECK(!field<bool>(c, path, "scale_attn_by_inverse_layer_idx", false), "'", path,
                "': \"scale_attn_by_inverse_layer_idx\" is true; the model does not scale attention by layer");
    TORCH_CHECK(!field<bool>(c, path, "add_cross_attention", false), "'", path,
                "': \"add_cross_attention\" is true; the model is a decoder only");
    note_ignored_dropout(c, path, {"attn_pdrop", "embd_pdrop", "resid_pdrop"}, ignored);
    g.validate();
    return g;
  }

  json config_json(const models::ModelConfig& config) const override {
    const models::GPTConfig& g = config.gpt();
    return json{{"architectures", {"GPT2LMHeadModel"}},
                {"model_type", "gpt2"},
                {"activation_function", "gelu_new"},
                {"attn_pdrop", 0.1},
                {"embd_pdrop", 0.1},
                {"resid_pdrop", 0.1},
                {"bos_token_id", g.vocab - 1},  // GPT-2's <|endoftext|> is its last token
                {"eos_token_id", g.vocab - 1},
                {"initializer_range", 0.02},
                {"layer_norm_epsilon", 1e-5},
                {"n_ctx", g.context},
                {"n_embd", g.width},
                {"n_head", g.heads},
                {"n_inner", nullptr},
                {"n_layer", g.layers},
                {"n_positions", g.context},
                {"reorder_and_upcast_attn", false},
                {"scale_attn_by_inverse_layer_idx", false},
                {"scale_attn_weights", true},
                {"summary_activation", nullptr},
                {"summary_first_dropout", 0.1},
                {"summary_proj_to_labels", true},
                {"summary_type", "cls_index"},
                {"summary_use_proj", true},
                {"tie_word_embeddings", true},
                {"torch_dtype", "float32"},
                {"use_cache", true},
                {"vocab_size", g.vocab}};
  }

  std::vector<safetensors::TensorSpec> parameter_specs(const models::ModelConfig& config) const override {
    const models::GPTConfig& g = config.gpt();
    const int64_t C = g.width;
    std::vector<safetensors::TensorSpec> specs{{"transformer.wte.weight", torch::kFloat, {g.vocab, C}},
                                               {"transformer.wpe.weight", torch::kFloat, {g.context, C}}};
    for (int64_t i = 0; i < g.layers; ++i) {
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"ln_1.weight", {C}},
               {"ln_1.bias", {C}},
               {"attn.c_attn.weight", {3 * C, C}},
               {"attn.c_attn.bias", {3 * C}},
               {"attn.c_proj.weight", {C, C}},
               {"attn.c_proj.bias", {C}},
               {"ln_2.weight", {C}},
               {"ln_2.bias", {C}},
               {"mlp.c_fc.weight", {4 * C, C}},
               {"mlp.c_fc.bias", {4 * C}},
               {"mlp.c_proj.weight", {C, 4 * C}},
               {"mlp.c_proj.bias", {C}}}) {
        specs.push_back({h + name, torch::kFloat, shape});
      }
    }
    specs.push_back({"transformer.ln_f.weight", torch::kFloat, {C}});
    specs.push_back({"transformer.ln_f.bias", torch::kFloat, {C}});
    return specs;
  }

  std::optional<std::string> from_hf_name(const models::ModelConfig&, const std::string& hf_name) const override {
    if (hf_name == "lm_head.weight") return std::nullopt;  // tied: the token embedding's
    if (ends_with(hf_name, ".attn.bias") || ends_with(hf_name, ".attn.masked_bias")) return std::nullopt;  // buffers
    return hf_name.rfind(kTransformerPrefix, 0) == 0 ? hf_name : kTransformerPrefix + hf_name;
  }

  bool is_transposed(const std::string& name) const override {
    return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
           ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
  }

  bool is_tied_head(const models::ModelConfig&, const std::string& name) const override {
    return name == "lm_head.weight";
  }
};

}  // namespace

const Adapter& gpt2_adapter() {
  static const Gpt2Adapter adapter;
  return adapter;
}

}  // namespace fsdp::hugging_face::detail
