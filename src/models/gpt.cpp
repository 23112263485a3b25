// The reference GPT (shared/spec/gpt.md). Blocks, and inside them attention
// and MLP, are called through fsdp::unit_forward: those calls are the unit
// boundaries a wrap policy can choose from.

#include "fsdp/gpt.h"

#include <cmath>
#include <sstream>

#include "base/strings.h"
#include "fsdp/fully_shard.h"
#include "fsdp/lora.h"
#include "models/attention_kernel.h"

namespace fsdp::models {

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  if (name == "tiny") {
    c.vocab = 256, c.context = 32, c.layers = 2, c.heads = 4, c.width = 64, c.batch = 4;
  } else if (name == "small") {
    c.vocab = 256, c.context = 128, c.layers = 4, c.heads = 8, c.width = 256, c.batch = 8;
  } else if (name == "medium") {
    c.vocab = 256, c.context = 256, c.layers = 8, c.heads = 8, c.width = 512, c.batch = 4;
  } else if (name == "large") {
    c.vocab = 256, c.context = 256, c.layers = 12, c.heads = 16, c.width = 1024, c.batch = 2;
  } else if (name == "xl") {  // GPT-2-XL's body (1.48 B parameters) at byte vocabulary: beyond one machine's memory
    c.vocab = 256, c.context = 1024, c.layers = 48, c.heads = 25, c.width = 1600, c.batch = 1;
  } else if (name == "3b") {  // GPT-2-XL's depth at width 2,304 (3.06 B parameters, 49 GB of state with AdamW)
    c.vocab = 256, c.context = 1024, c.layers = 48, c.heads = 18, c.width = 2304, c.batch = 1;
  } else {
    TORCH_CHECK(false, "unknown preset '", name, "': expected tiny, small, medium, large, xl or 3b");
  }
  return c;
}

void GPTConfig::validate() const {
  TORCH_CHECK(vocab > 0 && context > 0 && layers > 0 && heads > 0 && width > 0 && batch > 0,
              "every model dimension must be positive, got ", describe());
  TORCH_CHECK(width % heads == 0, "the width (", width, ") must be a multiple of the number of heads (", heads, ")");
}

std::string GPTConfig::describe() const {
  std::ostringstream s;
  s << "vocab " << vocab << ", context " << context << ", layers " << layers << ", heads " << heads << ", width "
    << width << ", batch " << batch;
  return s.str();
}

ModelDescription GPTConfig::plan_description() const {
  ModelDescription d;
  d.shape = TransformerShape{vocab, context, layers, heads, width, batch};
  d.shape.attention_saves_probabilities = resolve_attention(attention) == AttentionKernel::kWrittenOut;
  d.layer_units = d.shape.unit_numels();
  TransformerShape sublayer = d.shape;
  sublayer.sublayer_units = true;
  d.sublayer_units = sublayer.unit_numels();
  return d;
}

AttentionImpl::AttentionImpl(const GPTConfig& c) : heads_(c.heads), attention_(resolve_attention(c.attention)) {
  c_attn = register_module("c_attn", torch::nn::Linear(c.width, 3 * c.width));
  c_proj = register_module("c_proj", torch::nn::Linear(c.width, c.width));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const SequencePacking& packing) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / heads_;
  auto qkv = lora::forward(c_attn, x).split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, heads_, hs}).transpose(1, 2); };
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  torch::Tensor y = causal_attention(q, k, v, attention_, /*softmax_in_float=*/false, packing);
  return lora::forward(c_proj, y.transpose(1, 2).contiguous().view({B, T, C}));
}

MLPImpl::MLPImpl(const GPTConfig& c) {
  c_fc = register_module("c_fc", torch::nn::Linear(c.width, 4 * c.width));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * c.width, c.width));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return lora::forward(c_proj, torch::gelu(lora::forward(c_fc, x), "tanh"));
}

BlockImpl::BlockImpl(const GPTConfig& c) {
  auto ln = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width}).eps(1e-5)); };
  ln_1 = register_module("ln_1", ln());
  attn = register_module("attn", Attention(c));
  ln_2 = register_module("ln_2", ln());
  mlp = register_module("mlp", MLP(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const SequencePacking& packing) {
  // Attention and MLP are unit boundaries too, for policies that wrap them
  // (finer units: smaller gathered buffers); a plain call otherwise.
  torch::Tensor h = x + fsdp::unit_forward(attn, ln_1(x), packing);
  return h + fsdp::unit_forward(mlp, ln_2(h));
}

TransformerImpl::TransformerImpl(const GPTConfig& c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.width));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.width));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) h->push_back(Block(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width}).eps(1e-5)));
}

GPTImpl::GPTImpl(const GPTConfig& config) : config_(config) {
  config_.validate();
  transformer = register_module("transformer", Transformer(config_));
  lm_head = register_module("lm_head", TiedLMHead(transformer->wte->weight));
}

torch::Tensor GPTImpl::final_hidden(const torch::Tensor& idx, const SequencePacking& packing) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.context, "sequence length ", T, " exceeds the context ", config_.context);
  const torch::Tensor positions = packing.packed() ? packing.positions : torch::arange(T, idx.options());
  torch::Tensor x = transformer->wte(idx) + transformer->wpe(positions);
  for (const auto& block : *transformer->h) x = fsdp::unit_forward(*block->as<BlockImpl>(), x, packing);
  return transformer->ln_f(x);
}

torch::Tensor GPTImpl::logits(const torch::Tensor& idx) { return lm_head(final_hidden(idx)); }

torch::Tensor GPTImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  return next_token_loss(final_hidden(idx), lm_head->weight, targets);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets, const SequencePacking& packing,
                               double loss_divisor) {
  return next_token_loss(final_hidden(idx, packing), lm_head->weight, targets, loss_divisor);
}

void GPTImpl::init_parameter(const std::string& name, torch::Tensor& param) const {
  torch::NoGradGuard no_grad;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
  if (ends_with(name, ".bias")) {
    param.zero_();
  } else if (ends_with(name, "ln_1.weight") || ends_with(name, "ln_2.weight") || ends_with(name, "ln_f.weight")) {
    param.fill_(1.0);
  } else if (ends_with(name, "c_proj.weight")) {
    param.normal_(0.0, proj_std);
  } else {
    param.normal_(0.0, 0.02);
  }
}

}  // namespace fsdp::models
