// The Llama's Hugging Face adapter (hugging_face_adapter.h): LlamaForCausalLM,
// and the families that are a Llama with switches (llama.h's LlamaConfig):
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM.
// The model has Hugging Face's names and layout already (Phi-3's fused
// projections included: LlamaConfig::fused_projections).

#include <algorithm>

#include "models/hugging_face_adapter.h"

namespace fsdp::hugging_face::detail {
namespace {

using nlohmann::json;

// The families this adapter reads: config.json's model_type, and the class
// transformers builds for it.
const std::vector<std::pair<std::string, std::string>>& families() {
  static const std::vector<std::pair<std::string, std::string>> all{{"llama", "LlamaForCausalLM"},
                                                                    {"mistral", "MistralForCausalLM"},
                                                                    {"qwen2", "Qwen2ForCausalLM"},
                                                                    {"qwen3", "Qwen3ForCausalLM"},
                                                                    {"phi3", "Phi3ForCausalLM"}};
  return all;
}

// rope_theta and rope scaling: top level and rope_scaling (transformers 4),
// or rope_parameters (5). Scaling of type linear or llama3 is computed;
// another (yarn, dynamic, longrope, ...) is refused by name.
void read_rope(const json& c, const std::string& path, models::LlamaConfig& l) {
  l.rope_theta = field<double>(c, path, "rope_theta", 10000.0);
  const json* rope = nullptr;
  if (c.contains("rope_parameters") && c.at("rope_parameters").is_object()) rope = &c.at("rope_parameters");
  if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null()) {
    TORCH_CHECK(c.at("rope_scaling").is_object(), "'", path, "': \"rope_scaling\" is ", c.at("rope_scaling").dump(),
                ", expected an object or null");
    rope = &c.at("rope_scaling");
  }
  // Phi-3.5 and Phi-4-mini rotate part of each head only.
  double partial = field<double>(c, path, "partial_rotary_factor", 1.0);
  if (rope) partial = field<double>(*rope, path, "partial_rotary_factor", partial);
  TORCH_CHECK(partial == 1.0, "'", path, "': \"partial_rotary_factor\" is ", partial,
              "; the model rotates every channel of a head (1.0)");
  if (!rope) return;
  l.rope_theta = field<double>(*rope, path, "rope_theta", l.rope_theta);
  // transformers 4.3x wrote "type"; later ones "rope_type".
  const auto type = field<std::string>(*rope, path, "rope_type", field<std::string>(*rope, path, "type", std::string("default")));
  try {
    l.rope_scaling.kind = fsdp::parse_enum<fsdp::models::RopeScaling::Kind>(type);
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "'", path, "': rope scaling of type \"", type,
                "\" is not supported; the model computes default, linear and llama3");
  }
  if (l.rope_scaling.kind == models::RopeScaling::Kind::kNone) return;
  l.rope_scaling.factor = field<double>(*rope, path, "factor");
  if (l.rope_scaling.kind == models::RopeScaling::Kind::kLlama3) {
    l.rope_scaling.low_freq_factor = field<double>(*rope, path, "low_freq_factor");
    l.rope_scaling.high_freq_factor = field<double>(*rope, path, "high_freq_factor");
    l.rope_scaling.original_context = field<int64_t>(*rope, path, "original_max_position_embeddings");
  }
}

json rope_json(const models::LlamaConfig& l) {
  json rope{{"rope_theta", l.rope_theta}, {"rope_type", fsdp::enum_name(l.rope_scaling.kind)}};
  if (l.rope_scaling.kind == models::RopeScaling::Kind::kNone) return rope;
  rope["factor"] = l.rope_scaling.factor;
  if (l.rope_scaling.kind == models::RopeScaling::Kind::kLlama3) {
    rope["low_freq_factor"] = l.rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = l.rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = l.rope_scaling.original_context;
  }
  return rope;
}

class LlamaAdapter : public Adapter {
 public:
  models::ModelKind kind() const override { return models::ModelKind::kLlama; }
  std::vector<std::string> model_types() const override {
    std::vector<std::string> types;
    for (const auto& [type, architecture] : families()) types.push_back(type);
    return types;
  }

  models::ModelConfig read_config(const json& c, const std::string& path,
                                  std::vector<std::string>& ignored) const override {
    models::LlamaConfig l;
    l.hub_family = field<std::string>(c, path, "model_type");
    l.vocab = field<int64_t>(c, path, "vocab_size", int64_t{32000});
    l.width = field<int64_t>(c, path, "hidden_size", int64_t{4096});
    l.hidden = field<int64_t>(c, path, "intermediate_size", int64_t{11008});
    l.layers = field<int64_t>(c, path, "num_hidden_layers", int64_t{32});
    l.heads = field<int64_t>(c, path, "num_attention_heads", int64_t{32});
    l.kv_heads = field<int64_t>(c, path, "num_key_value_heads", l.heads);
    l.context = field<int64_t>(c, path, "max_position_embeddings", int64_t{2048});
    l.norm_eps = field<double>(c, path, "rms_norm_eps", 1e-6);
    read_rope(c, path, l);
    const auto activation = field<std::string>(c, path, "hidden_act", std::string("silu"));
    TORCH_CHECK(activation == "silu", "'", path, "': \"hidden_act\" is \"", activation,
                "\"; the model's MLP is SwiGLU (silu)");
    l.tie_word_embeddings = field<bool>(c, path, "tie_word_embeddings", false);
    TORCH_CHECK(!field<bool>(c, path, "mlp_bias", false), "'", path, "': \"mlp_bias\" is true; the model's MLP has no biases");
    const bool qwen2 = l.hub_family == "qwen2";
    l.qkv_bias = qwen2;  // Qwen2's q, k and v always have biases, its o_proj none
    if (!qwen2) l.attention_bias = field<bool>(c, path, "attention_bias", false);
    l.qk_norm = l.hub_family == "qwen3";
    l.fused_projections = l.hub_family == "phi3";
    // Without "head_dim" the heads split hidden_size evenly, or transformers
    // refuses the config: a truncated width / heads would plan and build a
    // model whose attention is narrower than the file's.
    const bool has_head_dim = c.contains("head_dim") && !c.at("head_dim").is_null();
    TORCH_CHECK(has_head_dim || l.heads <= 0 || l.width % l.heads == 0, "'", path, "': \"hidden_size\" ", l.width,
                " is not a multiple of \"num_attention_heads\" ", l.heads,
                ", and there is no \"head_dim\": expected heads that split the width evenly, or a \"head_dim\"");
    const int64_t head_dim = field<int64_t>(c, path, "head_dim", l.width / std::max<int64_t>(l.heads, 1));
    TORCH_CHECK(head_dim <= 0 || head_dim % 2 == 0, "'", path, "': the head dimension is ", head_dim,
                has_head_dim ? " (\"head_dim\")" : " (\"hidden_size\" / \"num_attention_heads\")",
                "; expected an even one: the rotary embedding rotates channel pairs");
    if (head_dim * l.heads != l.width) l.explicit_head_dim = head_dim;
    // A window only matters past its length: refused where a sequence is longer (LlamaImpl::logits).
    const bool window_used = l.hub_family == "mistral" || l.hub_family == "phi3" ||
                             field<bool>(c, path, "use_sliding_window", false);
    if (window_used) l.sliding_window = field<int64_t>(c, path, "sliding_window", int64_t{0});
    note_ignored_dropout(c, path, {"attention_dropout", "resid_pdrop", "embd_pdrop"}, ignored);
    l.validate();
    return l;
  }

  json config_json(const models::ModelConfig& config) const override {
    const models::LlamaConfig& l = config.llama();
    std::string architecture = "LlamaForCausalLM";
    for (const auto& [type, name] : families()) {
      if (type == l.hub_family) architecture = name;
    }
    json j{{"architectures", {architecture}},
           {"model_type", l.hub_family},
           {"attention_dropout", 0.0},
           {"bos_token_id", nullptr},
           {"eos_token_id", nullptr},
           {"head_dim", l.head_dim()},
           {"hidden_act", "silu"},
           {"hidden_size", l.width},
           {"initializer_range", 0.02},
           {"intermediate_size", l.hidden},
           {"max_position_embeddings", l.context},
           {"num_attention_heads", l.heads},
           {"num_hidden_layers", l.layers},
           {"num_key_value_heads", l.kv_heads},
           {"rms_norm_eps", l.norm_eps},
           {"rope_theta", l.rope_theta},  // transformers 4 reads these two
           {"rope_scaling", l.rope_scaling.kind == models::RopeScaling::Kind::kNone ? json(nullptr) : rope_json(l)},
           {"rope_parameters", rope_json(l)},  // transformers 5
           {"tie_word_embeddings", l.tie_word_embeddings},
           {"torch_dtype", "float32"},
           {"use_cache", true},
           {"vocab_size", l.vocab}};
    if (l.hub_family != "qwen2" && l.hub_family != "phi3") j["attention_bias"] = l.attention_bias;
    if (l.hub_family == "llama") j["mlp_bias"] = false, j["pretraining_tp"] = 1;
    if (l.hub_family == "phi3") j["rope_parameters"]["partial_rotary_factor"] = 1.0;
    if (l.hub_family == "mistral" || l.hub_family == "phi3" || l.sliding_window > 0) {
      j["sliding_window"] = l.sliding_window > 0 ? json(l.sliding_window) : json(nullptr);
    }
    if (l.hub_family == "qwen2" || l.hub_family == "qwen3") j["use_sliding_window"] = l.sliding_window > 0;
    return j;
  }

  std::vector<safetensors::TensorSpec> parameter_specs(const models::ModelConfig& config) const override {
    const models::LlamaConfig& l = config.llama();
    const int64_t C = l.width, q = l.heads * l.head_dim(), kv = l.kv_heads * l.head_dim();
    const bool qkv_bias = l.qkv_bias || l.attention_bias;
    std::vector<safetensors::TensorSpec> specs{{"model.embed_tokens.weight", torch::kFloat, {l.vocab, C}}};
    for (int64_t i = 0; i < l.layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      std::vector<std::pair<std::string, std::vector<int64_t>>> layer{{"input_layernorm.weight", {C}}};
      const std::vector<std::pair<std::string, int64_t>> projections =
          l.fused_projections ? std::vector<std::pair<std::string, int64_t>>{{"qkv_proj", q + 2 * kv}}
                              : std::vector<std::pair<std::string, int64_t>>{{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
      for (const auto& [projection, rows] : projections) {
        layer.push_back({"self_attn." + projection + ".weight", {rows, C}});
        if (qkv_bias) layer.push_back({"self_attn." + projection + ".bias", {rows}});
      }
      layer.push_back({"self_attn.o_proj.weight", {C, q}});
      if (l.attention_bias) layer.push_back({"self_attn.o_proj.bias", {C}});
      if (l.qk_norm) {
        layer.push_back({"self_attn.q_norm.weight", {l.head_dim()}});
        layer.push_back({"self_attn.k_norm.weight", {l.head_dim()}});
      }
      layer.push_back({"post_attention_layernorm.weight", {C}});
      if (l.fused_projections) {
        layer.push_back({"mlp.gate_up_proj.weight", {2 * l.hidden, C}});
      } else {
        layer.push_back({"mlp.gate_proj.weight", {l.hidden, C}});
        layer.push_back({"mlp.up_proj.weight", {l.hidden, C}});
      }
      layer.push_back({"mlp.down_proj.weight", {C, l.hidden}});
      for (const auto& [name, shape] : layer) specs.push_back({p + name, torch::kFloat, shape});
    }
    specs.push_back({"model.norm.weight", torch::kFloat, {C}});
    if (!l.tie_word_embeddings) specs.push_back({"lm_head.weight", torch::kFloat, {l.vocab, C}});
    return specs;
  }

  std::optional<std::string> from_hf_name(const models::ModelConfig& config, const std::string& hf_name) const override {
    // The same names; old files kept RoPE's inverse frequencies; a tied head
    // written out anyway is the embedding's copy.
    if (ends_with(hf_name, ".rotary_emb.inv_freq") || is_tied_head(config, hf_name)) return std::nullopt;
    return hf_name;
  }

  bool is_tied_head(const models::ModelConfig& config, const std::string& name) const override {
    return name == "lm_head.weight" && config.llama().tie_word_embeddings;
  }
};

}  // namespace

const Adapter& llama_adapter() {
  static const LlamaAdapter adapter;
  return adapter;
}

}  // namespace fsdp::hugging_face::detail
