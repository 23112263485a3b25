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
#include "fsdp/model_description.h"
#include "fsdp/lora.h"
#include "base/strings.h"
#include "models/lora_adapters.h"
#include "models/unit_lists.h"
#include "models/attention_kernel.h"

namespace fsdp::models {
namespace {

// A Linear, without bias unless asked (Llama has none).
torch::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The rotary embedding's inverse frequencies, [hs / 2] in fp32: 1 / theta^(2i / hs),
// then scaled as transformers' rope_type says (_compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters).
torch::Tensor rotary_inverse_frequencies(int64_t hs, double theta, const RopeScaling& scaling,
                                         const torch::TensorOptions& fp32) {
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, hs, 2, fp32.dtype(torch::kLong)).to(torch::kFloat) / hs);
  switch (scaling.kind) {
    case RopeScaling::Kind::kNone:
      return inv_freq;
    case RopeScaling::Kind::kLinear:
      return inv_freq / scaling.factor;
    case RopeScaling::Kind::kLlama3: {
      const double old_context = static_cast<double>(scaling.original_context);
      const double low_freq_wavelen = old_context / scaling.low_freq_factor;
      const double high_freq_wavelen = old_context / scaling.high_freq_factor;
      const torch::Tensor wavelen = 2 * M_PI / inv_freq;
      torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq);
      const torch::Tensor smooth = (old_context / wavelen - scaling.low_freq_factor) /
                                   (scaling.high_freq_factor - scaling.low_freq_factor);
      const torch::Tensor smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
      const torch::Tensor medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
      return torch::where(medium, smoothed, scaled);
    }
  }
  TORCH_CHECK(false, "unknown rope scaling");
}

// The rotary embedding's cos and sin for positions 0 ... T - 1, [T, hs], or
// for packed rows' own positions [B, T] ([B, 1, T, hs], broadcast over the
// heads): transformers' LlamaRotaryEmbedding (the inverse frequencies in
// fp32, the angles over the concatenation of the two frequency halves).
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t T, int64_t hs, double theta, const RopeScaling& scaling,
                                                       const torch::Tensor& like, const SequencePacking& packing) {
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(like.device());
  const torch::Tensor inv_freq = rotary_inverse_frequencies(hs, theta, scaling, fp32);
  torch::Tensor angles =
      packing.packed() ? (packing.positions.to(torch::kFloat).unsqueeze(-1) * inv_freq).unsqueeze(1)
                       : torch::outer(torch::arange(T, fp32.dtype(torch::kLong)).to(torch::kFloat), inv_freq);
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
  TORCH_CHECK(name == "tiny" || name == "small" || name == "medium" || name == "large" || name == "xl" || name == "3b",
              "unknown preset '", name, "': expected tiny, small, medium, large, xl or 3b");
  // The GPT presets' table (fsdp/gpt.h; shared/spec/gpt.md), with grouped-query attention.
  static const std::map<std::string, std::array<int64_t, 6>> table = {
      {"tiny", {256, 32, 2, 4, 64, 4}},       {"small", {256, 128, 4, 8, 256, 8}},
      {"medium", {256, 256, 8, 8, 512, 4}},   {"large", {256, 256, 12, 16, 1024, 2}},
      {"xl", {256, 1024, 48, 25, 1600, 1}},   {"3b", {256, 1024, 48, 18, 2304, 1}}};
  const auto& v = table.at(name);
  LlamaConfig c;
  c.vocab = v[0], c.context = v[1], c.layers = v[2], c.heads = v[3], c.width = v[4], c.batch = v[5];
  c.kv_heads = c.heads % 2 == 0 ? c.heads / 2 : c.heads / 5;
  c.hidden = default_hidden(c.width);
  return c;
}

int64_t LlamaConfig::default_hidden(int64_t width) { return (8 * width / 3 + 31) / 32 * 32; }

}  // namespace fsdp::models

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<models::RopeScaling::Kind>) {
  static const EnumNames names = EnumNames::of<models::RopeScaling::Kind>("rope scaling", {
      {models::RopeScaling::Kind::kNone, "default"},
      {models::RopeScaling::Kind::kLinear, "linear"},
      {models::RopeScaling::Kind::kLlama3, "llama3"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::models {

void LlamaConfig::validate() const {
  TORCH_CHECK(vocab > 0 && context > 0 && layers > 0 && heads > 0 && kv_heads > 0 && width > 0 && hidden > 0 &&
                  batch > 0 && rope_theta > 0 && norm_eps > 0,
              "every model dimension must be positive, got ", describe());
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0: none), got ", sliding_window);
  TORCH_CHECK(explicit_head_dim >= 0, "head_dim must be positive (0: width / heads), got ", explicit_head_dim);
  TORCH_CHECK(explicit_head_dim > 0 || width % heads == 0, "the width (", width,
              ") must be a multiple of the number of heads (", heads, ")");
  TORCH_CHECK(head_dim() % 2 == 0, "the head dimension (", head_dim(),
              ") must be even: the rotary embedding rotates channel pairs");
  if (rope_scaling.kind != RopeScaling::Kind::kNone) {
    TORCH_CHECK(rope_scaling.factor > 0, "the rope scaling factor must be positive, got ", rope_scaling.factor);
  }
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    TORCH_CHECK(rope_scaling.low_freq_factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                    rope_scaling.original_context > 0,
                "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
                "original_max_position_embeddings, got ", rope_scaling.low_freq_factor, ", ",
                rope_scaling.high_freq_factor, " and ", rope_scaling.original_context);
  }
  TORCH_CHECK(heads % kv_heads == 0, "the number of heads (", heads, ") must be a multiple of kv_heads (", kv_heads,
              ")");
  check_size();
}

// The counts the planner and the model multiply, before any is computed in
// 64 bits or listed per layer: a config.json of a billion layers (or a width
// of a billion) once made every rank allocate its lists of units until the
// kernel's OOM killer came, before the preflight could say anything.
void LlamaConfig::check_size() const {
  const long double C = width, q = static_cast<long double>(heads) * head_dim(),
                    kv = static_cast<long double>(kv_heads) * head_dim();
  const long double layer = 2 * C * q + 2 * C * kv + 3 * C * hidden + 3 * q + 2 * C;
  const long double params = 2.0L * vocab * C + C + layers * layer;
  const long double limit = static_cast<long double>(int64_t{1} << 62);
  TORCH_CHECK(params * 64 < limit, "the model (", describe(), ") has ", static_cast<double>(params),
              " parameters: beyond what 64-bit byte counts hold (expected a config of a model that exists)");
  check_unit_lists_fit(2 * layers + 1, layers);  // a layer is up to two units (--wrap sublayer)
}

std::string LlamaConfig::describe() const {
  std::ostringstream s;
  s << "vocab " << vocab << ", context " << context << ", layers " << layers << ", heads " << heads << ", kv_heads "
    << kv_heads << ", width " << width << ", hidden " << hidden << ", rope_theta " << rope_theta << ", norm_eps "
    << norm_eps << ", batch " << batch;
  // The switches, only where set: a default Llama's text is what files wrote before them.
  if (tie_word_embeddings) s << ", tie_word_embeddings 1";
  if (attention_bias) s << ", attention_bias 1";
  if (qkv_bias) s << ", qkv_bias 1";
  if (qk_norm) s << ", qk_norm 1";
  if (explicit_head_dim > 0) s << ", head_dim " << explicit_head_dim;
  if (rope_scaling.kind != RopeScaling::Kind::kNone) {
    s << ", rope_scaling " << fsdp::enum_name(rope_scaling.kind) << ", rope_factor " << rope_scaling.factor;
  }
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    s << ", rope_low_freq_factor " << rope_scaling.low_freq_factor << ", rope_high_freq_factor "
      << rope_scaling.high_freq_factor << ", rope_original_context " << rope_scaling.original_context;
  }
  if (sliding_window > 0) s << ", sliding_window " << sliding_window;
  if (fused_projections) s << ", fused_projections 1";
  if (hub_family != "llama") s << ", hub_family " << hub_family;
  return s.str();
}

ModelDescription LlamaConfig::plan_description() const {
  validate();
  ModelDescription d;
  d.shape = TransformerShape{vocab, context, layers, heads, width, batch};
  d.shape.attention_saves_probabilities = resolve_attention(attention) == AttentionKernel::kWrittenOut;
  const int64_t C = width, q = heads * head_dim(), kv = kv_heads * head_dim();
  // Per token: 9 C measured for a layer whose queries are C wide; 4 more for
  // each query channel beyond C (the rotated q, the repeated k and v and the
  // attention's output are q wide); with q/k norms about 3 more for each
  // query and key channel (the norms' fp32 steps). Measured at W = 2 on
  // tests/trainer/cases/planner.sh's Qwen3-style shape (C 64, 4 heads, 2 kv
  // heads, batch 2, context 128), one switch at a time: head_dim 24 instead
  // of 16 keeps 124 elements a token a layer more (4 (q - C) = 128), q/k
  // norms 294 (3 (q + kv) = 288).
  d.shape.extra_layer_activations = 9 * C + 4 * (q - C) + (qk_norm ? 3 * (q + kv) : 0);
  // Fused attention reads the grouped key-value heads in place: the k and v
  // repeated to q's width are not kept (measured on LibTorch 2.15, W = 2:
  // 2 (q - kv) a token a layer less, small at 8 heads over 4 and the Qwen3
  // shape above; nothing less at kv_heads = heads).
  if (!d.shape.attention_saves_probabilities) d.shape.extra_layer_activations -= 2 * (q - kv);
  const int64_t biases = (attention_bias || qkv_bias ? q + 2 * kv : 0) + (attention_bias ? C : 0);
  const int64_t attention_numel = 2 * C * q + 2 * C * kv + biases + (qk_norm ? 2 * head_dim() : 0);
  const int64_t mlp = 3 * C * hidden, norms = 2 * C;
  const int64_t root = (tie_word_embeddings ? 1 : 2) * vocab * C + C;  // embed_tokens, lm_head, norm
  d.layer_units.assign(1, root);
  d.layer_units.insert(d.layer_units.end(), layers, attention_numel + mlp + norms);
  d.sublayer_units.assign(1, root + layers * norms);
  for (int64_t i = 0; i < layers; ++i) {
    d.sublayer_units.push_back(attention_numel);
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
    : heads_(c.heads),
      kv_heads_(c.kv_heads),
      head_dim_(c.head_dim()),
      rope_theta_(c.rope_theta),
      rope_scaling_(c.rope_scaling),
      attention_(resolve_attention(c.attention)) {
  const int64_t hs = c.head_dim();
  const bool qkv_bias = c.qkv_bias || c.attention_bias;
  if (c.fused_projections) {
    qkv_proj = register_module("qkv_proj", linear(c.width, (c.heads + 2 * c.kv_heads) * hs, qkv_bias));
  } else {
    q_proj = register_module("q_proj", linear(c.width, c.heads * hs, qkv_bias));
    k_proj = register_module("k_proj", linear(c.width, c.kv_heads * hs, qkv_bias));
    v_proj = register_module("v_proj", linear(c.width, c.kv_heads * hs, qkv_bias));
  }
  o_proj = register_module("o_proj", linear(c.heads * hs, c.width, c.attention_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", LlamaRMSNorm(hs, c.norm_eps));
    k_norm = register_module("k_norm", LlamaRMSNorm(hs, c.norm_eps));
  }
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const SequencePacking& packing) {
  const int64_t B = x.size(0), T = x.size(1), hs = head_dim_;
  // [B, T, n * hs] -> [B, n, T, hs]; Qwen3 normalizes each head's queries and keys first.
  auto split = [&](const torch::Tensor& t, int64_t n, LlamaRMSNorm* norm) {
    torch::Tensor heads = t.view({B, T, n, hs});
    if (norm && *norm) heads = (*norm)(heads);
    return heads.transpose(1, 2);
  };
  torch::Tensor q, k, v;
  if (qkv_proj) {  // Phi-3's one matrix: q, k and v along its output, as transformers slices it
    const torch::Tensor qkv = lora::forward(qkv_proj, x);
    q = split(qkv.narrow(-1, 0, heads_ * hs), heads_, &q_norm);
    k = split(qkv.narrow(-1, heads_ * hs, kv_heads_ * hs), kv_heads_, &k_norm);
    v = split(qkv.narrow(-1, (heads_ + kv_heads_) * hs, kv_heads_ * hs), kv_heads_, nullptr);
  } else {
    q = split(lora::forward(q_proj, x), heads_, &q_norm);
    k = split(lora::forward(k_proj, x), kv_heads_, &k_norm);
    v = split(lora::forward(v_proj, x), kv_heads_, nullptr);
  }
  auto [cos, sin] = rotary_cos_sin(T, hs, rope_theta_, rope_scaling_, x, packing);
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  torch::Tensor y = causal_attention(q, k, v, attention_, /*softmax_in_float=*/true, packing);
  return lora::forward(o_proj, y.transpose(1, 2).contiguous().view({B, T, heads_ * hs}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  if (c.fused_projections) {
    gate_up_proj = register_module("gate_up_proj", linear(c.width, 2 * c.hidden));
  } else {
    gate_proj = register_module("gate_proj", linear(c.width, c.hidden));
    up_proj = register_module("up_proj", linear(c.width, c.hidden));
  }
  down_proj = register_module("down_proj", linear(c.hidden, c.width));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  if (!gate_up_proj) return lora::forward(down_proj, torch::silu(lora::forward(gate_proj, x)) * lora::forward(up_proj, x));
  const auto gate_up = lora::forward(gate_up_proj, x).chunk(2, -1);  // Phi-3's: the gate's half first
  return lora::forward(down_proj, torch::silu(gate_up[0]) * gate_up[1]);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.width, c.norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", LlamaRMSNorm(c.width, c.norm_eps));
  mlp = register_module("mlp", LlamaMLP(c));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const SequencePacking& packing) {
  // Attention and MLP are unit boundaries too, for policies that wrap them.
  torch::Tensor h = x + fsdp::unit_forward(self_attn, input_layernorm(x), packing);
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
  if (config_.tie_word_embeddings) {
    // The embedding's weight itself under the head's name: one parameter, found
    // by identity (fully_shard keeps it in the root unit with both registrations).
    tied_lm_head = register_module("lm_head", TiedLMHead(model->embed_tokens->weight));
  } else {
    lm_head = register_module("lm_head", linear(config_.width, config_.vocab));
  }
}

torch::Tensor LlamaImpl::final_hidden(const torch::Tensor& idx, const SequencePacking& packing) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.context, "sequence length ", T, " exceeds the context ", config_.context);
  TORCH_CHECK(config_.sliding_window == 0 || T <= config_.sliding_window, "sequence length ", T,
              " exceeds the sliding window of ", config_.sliding_window,
              " (config.json's sliding_window): the model computes full causal attention, which equals the window's "
              "only within it; train on --context ", config_.sliding_window, " or less");
  torch::Tensor x = model->embed_tokens(idx);
  for (const auto& layer : *model->layers) x = fsdp::unit_forward(*layer->as<LlamaDecoderLayerImpl>(), x, packing);
  return model->norm(x);
}

torch::Tensor LlamaImpl::logits(const torch::Tensor& idx) {
  const torch::Tensor x = final_hidden(idx);
  return tied_lm_head ? tied_lm_head(x) : lora::forward(lm_head, x);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  return forward(idx, targets, SequencePacking(), 0.0);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets,
                                 const SequencePacking& packing, double loss_divisor) {
  const torch::Tensor hidden = final_hidden(idx, packing);
  if (lm_head && lora::has_adapter(lm_head)) {  // the adapted head's logits whole (its update joins the product)
    torch::Tensor out = lora::forward(lm_head, hidden).to(torch::kFloat);
    namespace F = torch::nn::functional;
    if (loss_divisor <= 0) return F::cross_entropy(out.view({-1, out.size(-1)}), targets.reshape({-1}));
    return F::cross_entropy(out.view({-1, out.size(-1)}), targets.reshape({-1}),
                            F::CrossEntropyFuncOptions().reduction(torch::kSum)) / loss_divisor;
  }
  return next_token_loss(hidden, tied_lm_head ? tied_lm_head->weight : lm_head->weight, targets, loss_divisor);
}

void LlamaImpl::init_parameter(const std::string& name, torch::Tensor& param) const {
  torch::NoGradGuard no_grad;
  const std::string suffix = "norm.weight";  // input_layernorm, post_attention_layernorm, norm
  if (ends_with(name, suffix)) {
    param.fill_(1.0);
  } else {
    param.normal_(0.0, 0.02);
  }
}

}  // namespace fsdp::models
