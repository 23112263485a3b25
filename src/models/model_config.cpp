// One model's configuration, of whichever family (fsdp/model_config.h).

#include "fsdp/model_config.h"

#include <map>
#include <sstream>

namespace fsdp::models {
ModelConfig ModelConfig::parse(ModelKind kind, const std::string& described) {
  std::string body = described;
  if (body.size() >= 2 && body.front() == '"' && body.back() == '"') body = body.substr(1, body.size() - 2);
  std::map<std::string, double> values;
  std::map<std::string, std::string> names;  // the values that are words (rope_scaling, hub_family)
  std::istringstream in(body);
  for (std::string item; std::getline(in, item, ',');) {
    std::istringstream words(item);
    std::string key, value;
    TORCH_CHECK(words >> key >> value, "cannot read the model configuration '", described,
                "': expected 'vocab N, context N, layers N, ...'");
    try {
      size_t used = 0;
      values[key] = std::stod(value, &used);
      TORCH_CHECK(used == value.size());
    } catch (const std::exception&) {
      values.erase(key);
      names[key] = value;
    }
  }
  auto get = [&](const char* key) {
    TORCH_CHECK(values.count(key), "the model configuration '", described, "' has no ", key);
    return values.at(key);
  };
  auto whole = [&](const char* key) { return static_cast<int64_t>(get(key)); };
  auto shared = [&](auto& c) {
    c.vocab = whole("vocab"), c.context = whole("context"), c.layers = whole("layers"), c.heads = whole("heads");
    c.width = whole("width");
  };
  if (kind == ModelKind::kGpt) {
    GPTConfig g;
    shared(g);
    g.validate();
    return g;
  }
  LlamaConfig l;
  shared(l);
  l.kv_heads = whole("kv_heads"), l.hidden = whole("hidden");
  l.rope_theta = get("rope_theta"), l.norm_eps = get("norm_eps");
  // The switches: absent where they are their defaults (LlamaConfig::describe).
  auto flag = [&](const char* key) { return values.count(key) && values.at(key) != 0; };
  l.tie_word_embeddings = flag("tie_word_embeddings");
  l.attention_bias = flag("attention_bias");
  l.qkv_bias = flag("qkv_bias");
  l.qk_norm = flag("qk_norm");
  l.fused_projections = flag("fused_projections");
  if (values.count("head_dim")) l.explicit_head_dim = whole("head_dim");
  if (values.count("sliding_window")) l.sliding_window = whole("sliding_window");
  if (names.count("rope_scaling")) {
    l.rope_scaling.kind = fsdp::parse_enum<fsdp::models::RopeScaling::Kind>(names.at("rope_scaling"));
    l.rope_scaling.factor = get("rope_factor");
  }
  if (l.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    l.rope_scaling.low_freq_factor = get("rope_low_freq_factor");
    l.rope_scaling.high_freq_factor = get("rope_high_freq_factor");
    l.rope_scaling.original_context = whole("rope_original_context");
  }
  if (names.count("hub_family")) l.hub_family = names.at("hub_family");
  l.validate();
  return l;
}

const GPTConfig& ModelConfig::gpt() const {
  TORCH_CHECK(kind() == ModelKind::kGpt, "the model is a ", fsdp::enum_name(kind()), ", not a gpt");
  return std::get<GPTConfig>(family_);
}

const LlamaConfig& ModelConfig::llama() const {
  TORCH_CHECK(kind() == ModelKind::kLlama, "the model is a ", fsdp::enum_name(kind()), ", not a llama");
  return std::get<LlamaConfig>(family_);
}

TransformerShape ModelConfig::shape() const {
  return std::visit([](const auto& c) {
    return TransformerShape{c.vocab, c.context, c.layers, c.heads, c.width, c.batch};
  }, family_);
}

void ModelConfig::set_context(int64_t context) {
  std::visit([&](auto& c) { c.context = context; }, family_);
}

void ModelConfig::set_batch(int64_t batch) {
  std::visit([&](auto& c) { c.batch = batch; }, family_);
}

void ModelConfig::set_attention(AttentionKernel attention) {
  std::visit([&](auto& c) { c.attention = attention; }, family_);
}

AttentionKernel ModelConfig::attention() const {
  return std::visit([](const auto& c) { return c.attention; }, family_);
}

std::string ModelConfig::describe() const {
  return std::visit([](const auto& c) { return c.describe(); }, family_);
}

ModelDescription ModelConfig::plan_description() const {
  return std::visit([](const auto& c) { return c.plan_description(); }, family_);
}

std::shared_ptr<LanguageModel> ModelConfig::new_model() const {
  if (kind() == ModelKind::kGpt) return GPT(gpt()).ptr();
  return Llama(llama()).ptr();
}

WrapPolicy ModelConfig::wrap_policy(bool per_sublayer) const {
  if (kind() == ModelKind::kGpt) {
    return per_sublayer ? module_type_policy<AttentionImpl, MLPImpl>() : module_type_policy<BlockImpl>();
  }
  return per_sublayer ? module_type_policy<LlamaAttentionImpl, LlamaMLPImpl>()
                      : module_type_policy<LlamaDecoderLayerImpl>();
}

}  // namespace fsdp::models
