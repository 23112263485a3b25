// The Llama's Hugging Face adapter (hugging_face_adapter.h): LlamaForCausalLM.
// The model (llama.h) has Hugging Face's names and layout already; its head
// is untied. Rope scaling is refused.

#include <algorithm>

#include "models/hugging_face_adapter.h"

namespace fsdp::hugging_face::detail {
namespace {

using nlohmann::json;

// rope_theta: top level (transformers 4), or in rope_parameters (5); any
// scaling (rope_scaling, a rope_type other than default) is refused.
double read_rope_theta(const json& c, const std::string& path) {
  double theta = field<double>(c, path, "rope_theta", 10000.0);
  if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null()) {
    TORCH_CHECK(false, "'", path, "': \"rope_scaling\" is ", c.at("rope_scaling").dump(),
                "; the model has plain rotary embeddings only (null)");
  }
  if (c.contains("rope_parameters") && c.at("rope_parameters").is_object()) {
    const json& rope = c.at("rope_parameters");
    const auto type = field<std::string>(rope, path, "rope_type", std::string("default"));
    TORCH_CHECK(type == "default", "'", path, "': \"rope_parameters\" has \"rope_type\" \"", type,
                "\"; the model has plain rotary embeddings only (default)");
    theta = field<double>(rope, path, "rope_theta", theta);
  }
  return theta;
}

class LlamaAdapter : public Adapter {
 public:
  models::ModelKind kind() const override { return models::ModelKind::kLlama; }
  std::vector<std::string> model_types() const override { return {"llama"}; }

  models::ModelConfig read_config(const json& c, const std::string& path,
                                  std::vector<std::string>& ignored) const override {
    models::LlamaConfig l;
    l.vocab = field<int64_t>(c, path, "vocab_size", int64_t{32000});
    l.width = field<int64_t>(c, path, "hidden_size", int64_t{4096});
    l.hidden = field<int64_t>(c, path, "intermediate_size", int64_t{11008});
    l.layers = field<int64_t>(c, path, "num_hidden_layers", int64_t{32});
    l.heads = field<int64_t>(c, path, "num_attention_heads", int64_t{32});
    l.kv_heads = field<int64_t>(c, path, "num_key_value_heads", l.heads);
    l.context = field<int64_t>(c, path, "max_position_embeddings", int64_t{2048});
    l.norm_eps = field<double>(c, path, "rms_norm_eps", 1e-6);
    l.rope_theta = read_rope_theta(c, path);
    const auto activation = field<std::string>(c, path, "hidden_act", std::string("silu"));
    TORCH_CHECK(activation == "silu", "'", path, "': \"hidden_act\" is \"", activation,
                "\"; the model's MLP is SwiGLU (silu)");
    TORCH_CHECK(!field<bool>(c, path, "tie_word_embeddings", false), "'", path,
                "': \"tie_word_embeddings\" is true; the model's head is untied");
    TORCH_CHECK(!field<bool>(c, path, "attention_bias", false) && !field<bool>(c, path, "mlp_bias", false), "'", path,
                "': \"attention_bias\" or \"mlp_bias\" is true; the model has no biases");
    const int64_t head_dim = field<int64_t>(c, path, "head_dim", l.width / std::max<int64_t>(l.heads, 1));
    TORCH_CHECK(head_dim * l.heads == l.width, "'", path, "': \"head_dim\" is ", head_dim,
                "; the model's is hidden_size / num_attention_heads = ", l.width / std::max<int64_t>(l.heads, 1));
    note_ignored_dropout(c, path, {"attention_dropout"}, ignored);
    l.validate();
    return l;
  }

  json config_json(const models::ModelConfig& config) const override {
    const models::LlamaConfig& l = config.llama();
    return json{{"architectures", {"LlamaForCausalLM"}},
                {"model_type", "llama"},
                {"attention_bias", false},
                {"attention_dropout", 0.0},
                {"bos_token_id", nullptr},
                {"eos_token_id", nullptr},
                {"head_dim", l.head_dim()},
                {"hidden_act", "silu"},
                {"hidden_size", l.width},
                {"initializer_range", 0.02},
                {"intermediate_size", l.hidden},
                {"max_position_embeddings", l.context},
                {"mlp_bias", false},
                {"num_attention_heads", l.heads},
                {"num_hidden_layers", l.layers},
                {"num_key_value_heads", l.kv_heads},
                {"pretraining_tp", 1},
                {"rms_norm_eps", l.norm_eps},
                {"rope_scaling", nullptr},  // transformers 4 reads these two
                {"rope_theta", l.rope_theta},
                {"rope_parameters", {{"rope_theta", l.rope_theta}, {"rope_type", "default"}}},  // transformers 5
                {"tie_word_embeddings", false},
                {"torch_dtype", "float32"},
                {"use_cache", true},
                {"vocab_size", l.vocab}};
  }

  std::vector<safetensors::TensorSpec> parameter_specs(const models::ModelConfig& config) const override {
    const models::LlamaConfig& l = config.llama();
    const int64_t C = l.width, kv = l.kv_heads * l.head_dim();
    std::vector<safetensors::TensorSpec> specs{{"model.embed_tokens.weight", torch::kFloat, {l.vocab, C}}};
    for (int64_t i = 0; i < l.layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"input_layernorm.weight", {C}},
               {"self_attn.q_proj.weight", {C, C}},
               {"self_attn.k_proj.weight", {kv, C}},
               {"self_attn.v_proj.weight", {kv, C}},
               {"self_attn.o_proj.weight", {C, C}},
               {"post_attention_layernorm.weight", {C}},
               {"mlp.gate_proj.weight", {l.hidden, C}},
               {"mlp.up_proj.weight", {l.hidden, C}},
               {"mlp.down_proj.weight", {C, l.hidden}}}) {
        specs.push_back({p + name, torch::kFloat, shape});
      }
    }
    specs.push_back({"model.norm.weight", torch::kFloat, {C}});
    specs.push_back({"lm_head.weight", torch::kFloat, {l.vocab, C}});
    return specs;
  }

  std::optional<std::string> from_hf_name(const std::string& hf_name) const override {
    // The same names; old files kept RoPE's inverse frequencies.
    const std::string buffer = ".rotary_emb.inv_freq";
    const bool is_buffer = hf_name.size() >= buffer.size() &&
                           hf_name.compare(hf_name.size() - buffer.size(), buffer.size(), buffer) == 0;
    return is_buffer ? std::nullopt : std::optional<std::string>(hf_name);
  }
};

}  // namespace

const Adapter& llama_adapter() {
  static const LlamaAdapter adapter;
  return adapter;
}

}  // namespace fsdp::hugging_face::detail
