// What every language model shares: the seeded initialization in named order
// and the parameter count (fsdp/language_model.h).

#include "fsdp/language_model.h"

#include "fsdp/fully_shard.h"

namespace fsdp::models {

const char* model_kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::kGpt: return "gpt";
    case ModelKind::kLlama: return "llama";
  }
  TORCH_CHECK(false, "unknown model kind ", static_cast<int>(kind));
}

ModelKind parse_model_kind(const std::string& name) {
  for (ModelKind kind : {ModelKind::kGpt, ModelKind::kLlama}) {
    if (name == model_kind_name(kind)) return kind;
  }
  TORCH_CHECK(false, "unknown model '", name, "': expected gpt or llama");
}

TiedLMHeadImpl::TiedLMHeadImpl(const torch::Tensor& tied_weight) {
  weight = register_parameter("weight", tied_weight);
}

torch::Tensor TiedLMHeadImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }

void LanguageModel::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& [name, param] : fsdp::unique_named_parameters(*this)) init_parameter(name, param);  // a tied weight once
}

int64_t LanguageModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : fsdp::unique_named_parameters(*this)) n += p.second.numel();
  return n;
}

}  // namespace fsdp::models
