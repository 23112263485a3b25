// The Llama (fsdp/llama.h): Hugging Face's LlamaForCausalLM, computed the way
// transformers computes it in eager mode (RMSNorm and the rotary angles in
// fp32). Decoder layers, and inside them attention and MLP, are called
// through fsdp::unit_forward: those calls are the unit boundaries a wrap
// policy can choose from.

#include "fsdp/llama.h"

#include <cmath>
#include <array>
#include <limits>
#include <map>
#include <sstream>

#include "fsdp/fully_shard.h"

namespace fsdp::models {
namespace {

// A Linear without bias (Llama has none).
torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// The rotary embedding's cos and sin for positions 0 ... T - 1, [T, hs]:
// transformers' LlamaRotaryEmbedding (inv_freq = 1 / theta^(2i / hs) in fp32,
// the angles over the concatenation of the two frequency halves).
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t T, int64_t hs, double theta, const torch::Tensor& like) {
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(like.device());
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, hs, 2, fp32.dtype(torch::kLong)).to(torch::kFloat) / hs);
  torch::Tensor angles = torch::outer(torch::arange(T, fp32.dtype(torch::kLong)).to(torch::kFloat), inv_freq);
  torch::Tensor emb = torch::cat({angles, angles}, -1);
  return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) of x's halves.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto halves = x.chunk(2, -1);
  return x * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
}

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  TORCH_CHECK(name == "tiny" || name == "small" || name == "medium" || name == "large" || name == "xl",
              "unknown preset '", name, "': expected tiny, small, medium, large or xl");
  // The GPT presets' table (fsdp/gpt.h; shared/spec/gpt.md), with grouped-query attention.
  static const std::map<std::string, std::array<int64_t, 6>> table = {
      {"tiny", {256, 32, 2, 4, 64, 4}},       {"small", {256, 128, 4, 8, 256, 8}},
      {"medium", {256, 256, 8, 8, 512, 4}},   {"large", {256, 256, 12, 16, 1024, 2}},
      {"xl", {256, 1024, 48, 25, 1600, 1}}};
  const auto& v = table.at(name);
  LlamaConfig c;
  c.vocab = v[0], c.context = v[1], c.layers = v[2], c.heads = v[3], c.width = v[4], c.batch = v[5];
  c.kv_heads = c.heads % 2 == 0 ? c.heads / 2 : c.heads / 5;
  c.hidden = default_hidden(c.width);
  return c;
}

int64_t LlamaConfig::default_hidden(int64_t width) { return (8 * width / 3 + 31) / 32 * 32; }

void LlamaConfig::validate() const {
  TORCH_CHECK(vocab > 0 && context > 0 && layers > 0 && heads > 0 && kv_heads > 0 && width > 0 && hidden > 0 &&
                  batch > 0 && rope_theta > 0 && norm_eps > 0,
              "every model dimension must be positive, got ", describe());
  TORCH_CHECK(width % heads == 0, "the width (", width, ") must be a multiple of the number of heads (", heads, ")");
  TORCH_CHECK(head_dim() % 2 == 0, "the head dimension width / heads (", head_dim(),
              ") must be even: the rotary embedding rotates channel pairs");
  TORCH_CHECK(heads % kv_heads == 0, "the number of heads (", heads, ") must be a multiple of kv_heads (", kv_heads,
              ")");
}

std::string LlamaConfig::describe() const {
  std::ostringstream s;
  s << "vocab " << vocab << ", context " << context << ", layers " << layers << ", heads " << heads << ", kv_heads "
    << kv_heads << ", width " << width << ", hidden " << hidden << ", rope_theta " << rope_theta << ", norm_eps "
    << norm_eps << ", batch " << batch;
  return s.str();
}

ModelDescription LlamaConfig::plan_description() const {
  validate();
  ModelDescription d;
  d.shape = TransformerShape{vocab, context, layers, heads, width, batch};
  d.shape.extra_layer_activations = 9;
  const int64_t C = width, kv = kv_heads * head_dim();
  const int64_t attention = 2 * C * C + 2 * C * kv, mlp = 3 * C * hidden, norms = 2 * C;
  d.layer_units.assign(1, 2 * vocab * C + C);  // embed_tokens, lm_head, norm
  d.layer_units.insert(d.layer_units.end(), layers, attention + mlp + norms);
  d.sublayer_units.assign(1, 2 * vocab * C + C + layers * norms);
  for (int64_t i = 0; i < layers; ++i) {
    d.sublayer_units.push_back(attention);
    d.sublayer_units.push_back(mlp);
  }
  return d;
}

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t width, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x.to(torch::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : heads_(c.heads), kv_heads_(c.kv_heads), rope_theta_(c.rope_theta) {
  const int64_t hs = c.head_dim();
  q_proj = register_module("q_proj", linear(c.width, c.heads * hs));
  k_proj = register_module("k_proj", linear(c.width, c.kv_heads * hs));
  v_proj = register_module("v_proj", linear(c.width, c.kv_heads * hs));
  o_proj = register_module("o_proj", linear(c.heads * hs, c.width));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), hs = q_proj->weight.size(0) / heads_;
  auto split = [&](const torch::Tensor& t, int64_t n) { return t.view({B, T, n, hs}).transpose(1, 2); };
  auto [cos, sin] = rotary_cos_sin(T, hs, rope_theta_, x);
  torch::Tensor q = apply_rotary(split(q_proj(x), heads_), cos, sin);
  torch::Tensor k = apply_rotary(split(k_proj(x), kv_heads_), cos, sin);
  torch::Tensor v = split(v_proj(x), kv_heads_);
  if (kv_heads_ != heads_) {  // transformers' repeat_kv: head h reads kv head h / (heads / kv_heads)
    k = k.repeat_interleave(heads_ / kv_heads_, /*dim=*/1);
    v = v.repeat_interleave(heads_ / kv_heads_, /*dim=*/1);
  }
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
  torch::Tensor future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  torch::Tensor y = torch::matmul(probs, v);
  return o_proj(y.transpose(1, 2).contiguous().view({B, T, heads_ * hs}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.width, c.hidden));
  up_proj = register_module("up_proj", linear(c.width, c.hidden));
  down_proj = register_module("down_proj", linear(c.hidden, c.width));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.width, c.norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", LlamaRMSNorm(c.width, c.norm_eps));
  mlp = register_module("mlp", LlamaMLP(c));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x) {
  // Attention and MLP are unit boundaries too, for policies that wrap them.
  torch::Tensor h = x + fsdp::unit_forward(self_attn, input_layernorm(x));
  return h + fsdp::unit_forward(mlp, post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.width));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) layers->push_back(LlamaDecoderLayer(c));
  norm = register_module("norm", LlamaRMSNorm(c.width, c.norm_eps));
}

LlamaImpl::LlamaImpl(const LlamaConfig& config) : config_(config) {
  config_.validate();
  model = register_module("model", LlamaModel(config_));
  lm_head = register_module("lm_head", linear(config_.width, config_.vocab));
}

torch::Tensor LlamaImpl::logits(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.context, "sequence length ", T, " exceeds the context ", config_.context);
  torch::Tensor x = model->embed_tokens(idx);
  for (const auto& layer : *model->layers) x = fsdp::unit_forward(*layer->as<LlamaDecoderLayerImpl>(), x);
  return lm_head(model->norm(x));
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  torch::Tensor out = logits(idx).to(torch::kFloat);  // the loss in fp32 whatever the compute dtype
  return torch::nn::functional::cross_entropy(out.view({-1, out.size(-1)}), targets.reshape({-1}));
}

void LlamaImpl::init_parameter(const std::string& name, torch::Tensor& param) const {
  torch::NoGradGuard no_grad;
  const std::string suffix = "norm.weight";  // input_layernorm, post_attention_layernorm, norm
  if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    param.fill_(1.0);
  } else {
    param.normal_(0.0, 0.02);
  }
}

}  // namespace fsdp::models
