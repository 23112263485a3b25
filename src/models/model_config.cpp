// One model's configuration, of whichever family (fsdp/model_config.h).

#include "fsdp/model_config.h"

#include <map>
#include <sstream>

namespace fsdp::models {
ModelConfig ModelConfig::parse(ModelKind kind, const std::string& described) {
  std::string body = described;
  if (body.size() >= 2 && body.front() == '"' && body.back() == '"') body = body.substr(1, body.size() - 2);
  std::map<std::string, double> values;
  std::istringstream in(body);
  for (std::string item; std::getline(in, item, ',');) {
    std::istringstream words(item);
    std::string key;
    double value = 0;
    TORCH_CHECK(words >> key >> value, "cannot read the model configuration '", described,
                "': expected 'vocab N, context N, layers N, ...'");
    values[key] = value;
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
  l.validate();
  return l;
}

const GPTConfig& ModelConfig::gpt() const {
  TORCH_CHECK(kind() == ModelKind::kGpt, "the model is a ", model_kind_name(kind()), ", not a gpt");
  return std::get<GPTConfig>(family_);
}

const LlamaConfig& ModelConfig::llama() const {
  TORCH_CHECK(kind() == ModelKind::kLlama, "the model is a ", model_kind_name(kind()), ", not a llama");
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
