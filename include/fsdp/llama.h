#pragma once
/// \file
/// A Llama-style decoder under Hugging Face's LlamaForCausalLM names and
/// semantics (so that its safetensors map one to one): token embeddings,
/// pre-RMSNorm blocks of causal grouped-query attention with rotary position
/// embeddings and a SwiGLU MLP, a final RMSNorm and an lm head. The switches
/// the hub's Llama-like families differ by (LlamaConfig) make it their
/// decoder too: a head tied to the embedding (Llama 3.2, SmolLM2, small
/// Qwen2.5), biases on the attention's projections (Qwen2), a per-head
/// RMSNorm of queries and keys and an explicit head_dim (Qwen3), rotary
/// scaling of type linear or llama3 (Llama 3.1 and later), the projections
/// fused into one matrix each for q, k and v and for gate and up (Phi-3).

#include <torch/torch.h>

#include <string>

#include "fsdp/attention.h"
#include "fsdp/language_model.h"

namespace fsdp::models {

/// Rotary position scaling (config.json's rope_scaling / rope_parameters),
/// as transformers computes the inverse frequencies.
struct RopeScaling {
  /// What scales the frequencies.
  /// Named by enum_name, parsed by parse_enum: "default", "linear", "llama3".
  enum class Kind {
    kNone,    ///< plain rotary embeddings ("default")
    kLinear,  ///< every frequency divided by factor ("linear")
    kLlama3,  ///< Llama 3.1's: low frequencies divided by factor, high ones kept, smoothed between ("llama3")
  };
  Kind kind = Kind::kNone;  ///< rope_type
  double factor = 1.0;  ///< factor
  double low_freq_factor = 1.0;  ///< llama3: low_freq_factor
  double high_freq_factor = 4.0;  ///< llama3: high_freq_factor
  int64_t original_context = 8192;  ///< llama3: original_max_position_embeddings
};
}  // namespace fsdp::models
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<models::RopeScaling::Kind>);  ///< "default", "linear", "llama3"
}  // namespace fsdp::detail
namespace fsdp::models {

/// The model's dimensions (Hugging Face LlamaConfig's fields) and the per-rank batch.
struct LlamaConfig {
  int64_t vocab = 256;  ///< vocab_size: token ids 0 ... vocab - 1
  int64_t context = 32;  ///< T: tokens per training sequence (max_position_embeddings)
  int64_t layers = 2;  ///< num_hidden_layers: decoder layers
  int64_t heads = 4;  ///< num_attention_heads (width must be a multiple)
  int64_t kv_heads = 2;  ///< num_key_value_heads: heads share keys and values in groups of heads / kv_heads
  int64_t width = 64;  ///< hidden_size: the embedding width C
  int64_t hidden = 192;  ///< intermediate_size: the SwiGLU MLP's inner width
  double rope_theta = 10000.0;  ///< rope_theta: the rotary embedding's base
  double norm_eps = 1e-5;  ///< rms_norm_eps
  int64_t batch = 4;  ///< per rank
  /// tie_word_embeddings: the lm head's weight is the token embedding's (one
  /// parameter, in the root unit with both).
  bool tie_word_embeddings = false;
  /// attention_bias: biases on q_proj, k_proj, v_proj and o_proj.
  bool attention_bias = false;
  /// Biases on q_proj, k_proj and v_proj only (Qwen2's attention).
  bool qkv_bias = false;
  /// A per-head RMSNorm of queries and keys before the rotation, self_attn.q_norm and k_norm (Qwen3's attention).
  bool qk_norm = false;
  /// head_dim when it is not width / heads (Qwen3's); 0: width / heads.
  int64_t explicit_head_dim = 0;
  /// rope_scaling.
  RopeScaling rope_scaling;
  /// sliding_window (Mistral; Qwen with use_sliding_window): each position
  /// attends to at most this many; 0: no window. The model computes full
  /// causal attention, the same within the window: a longer sequence is refused.
  int64_t sliding_window = 0;
  /// Phi-3's fused projections: self_attn.qkv_proj (q, k and v rows one
  /// after another) instead of q_proj, k_proj and v_proj, and mlp.gate_up_proj
  /// (gate rows, then up rows) instead of gate_proj and up_proj. The same
  /// function and parameter count; Hugging Face's names and layout for Phi-3.
  bool fused_projections = false;
  /// config.json's model_type for the Hugging Face family it came from and
  /// goes back to: llama, mistral, qwen2, qwen3, phi3.
  std::string hub_family = "llama";
  /// How attention is computed (fsdp/attention.h): a property of the run, not
  /// of the weights, so describe() leaves it out and checkpoints do not record it.
  AttentionKernel attention = AttentionKernel::kAuto;

  /// "tiny", "small", "medium", "large" or "xl": the GPT presets' vocab,
  /// context, layers, heads, width and batch (GPTConfig::preset), with
  /// kv_heads = heads / 2 (heads / 5 for xl's 25) and hidden =
  /// default_hidden(width); throws for anything else.
  static LlamaConfig preset(const std::string& name);
  /// Llama's SwiGLU width for `width`: 8 width / 3 rounded up to a multiple
  /// of 32 (the parameters of a 4x MLP in three matrices): 192 for width 64.
  static int64_t default_hidden(int64_t width);
  /// explicit_head_dim, else width / heads.
  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : width / heads; }
  /// Throws, naming the dimensions, unless all are positive, width is a
  /// multiple of heads (without an explicit head_dim) with an even
  /// head_dim, and heads a multiple of kv_heads.
  void validate() const;
  /// Throws unless its parameters' bytes fit 64-bit counts and its layers'
  /// lists this host (validate() calls it; before anything is allocated).
  void check_size() const;
  /// "vocab 256, context 32, layers 2, heads 4, kv_heads 2, width 64, hidden
  /// 192, rope_theta 10000, norm_eps 1e-05, batch 4", then each switch that
  /// is not its default ("tie_word_embeddings 1", "rope_scaling llama3",
  /// "rope_factor 8", "hub_family qwen2", ...).
  std::string describe() const;
  /// The planner's description (run_plan.h). Its units: the root holds the
  /// embedding, the final norm and the head (2 V C + C), a decoder layer
  /// 2 C^2 + 2 C kv_heads head_dim + 3 C hidden + 2 C; per sublayer the
  /// attention and the MLP apart, the layer's norms in the root. A layer
  /// keeps about 9 M C activation elements more than the GPT block the
  /// planner's formula counts (RMSNorm's fp32 steps, the rotary halves, the
  /// repeated kv heads, SwiGLU's three hidden-wide tensors): measured 9.2,
  /// 9.0 and 10.6 M C on small, medium and tiny at W = 2; with an explicit
  /// head_dim 4 M more per query channel beyond C, with q/k norms 3 M per
  /// query and key channel.
  ModelDescription plan_description() const;
};

/// Hugging Face's LlamaRMSNorm: in fp32, x * rsqrt(mean(x^2) + eps), cast
/// back to x's dtype, times the gain.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  /// Registers the gain (ones) for `width` channels.
  LlamaRMSNormImpl(int64_t width, double eps);
  /// [..., width] -> [..., width].
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  ///< the gain
  double eps;  ///< added to the mean square
};
/// The module holder of LlamaRMSNormImpl.
TORCH_MODULE(LlamaRMSNorm);

/// Causal grouped-query self-attention with rotary position embeddings
/// (Hugging Face's rotate_half layout, cos and sin computed in fp32 for
/// positions 0 ... T - 1), scaled by 1 / sqrt(head_dim).
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  /// Registers the projections for `config`'s widths.
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  /// [B, T, C] -> [B, T, C], each position attending to itself and the ones
  /// before in its sequence (rotated by its position in it, with `packing`).
  torch::Tensor forward(const torch::Tensor& x, const SequencePacking& packing = SequencePacking());
  /// Queries (C -> heads x head_dim), keys and values (C -> kv_heads x head_dim),
  /// the output (heads x head_dim -> C); biases as LlamaConfig's attention_bias
  /// and qkv_bias say. With LlamaConfig::fused_projections, q_proj, k_proj
  /// and v_proj are null and qkv_proj computes the three at once.
  ///@{
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr}, qkv_proj{nullptr};
  ///@}
  /// With LlamaConfig::qk_norm, each head's queries and keys RMS-normalized (gain of head_dim); else null.
  ///@{
  LlamaRMSNorm q_norm{nullptr}, k_norm{nullptr};
  ///@}

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double rope_theta_;
  RopeScaling rope_scaling_;
  AttentionKernel attention_;
};
/// The module holder of LlamaAttentionImpl.
TORCH_MODULE(LlamaAttention);

/// The SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  /// Registers the projections for `config`'s width and hidden.
  explicit LlamaMLPImpl(const LlamaConfig& config);
  /// [B, T, C] -> [B, T, C].
  torch::Tensor forward(const torch::Tensor& x);
  /// C -> hidden, C -> hidden and hidden -> C; no biases. With
  /// LlamaConfig::fused_projections, gate_proj and up_proj are null and
  /// gate_up_proj (C -> 2 hidden) computes both.
  ///@{
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr}, gate_up_proj{nullptr};
  ///@}
};
/// The module holder of LlamaMLPImpl.
TORCH_MODULE(LlamaMLP);

/// One decoder layer: the natural FSDP unit.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  /// Registers the norms, the attention and the MLP for `config`.
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config);
  /// Pre-norm residual: x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)).
  torch::Tensor forward(const torch::Tensor& x, const SequencePacking& packing = SequencePacking());
  LlamaRMSNorm input_layernorm{nullptr};  ///< the norm before the attention
  LlamaAttention self_attn{nullptr};  ///< the self-attention
  LlamaRMSNorm post_attention_layernorm{nullptr};  ///< the norm before the MLP
  LlamaMLP mlp{nullptr};  ///< the MLP
};
/// The module holder of LlamaDecoderLayerImpl.
TORCH_MODULE(LlamaDecoderLayer);

/// The model's body (Hugging Face's LlamaModel): embeddings, layers, final
/// norm (LlamaImpl runs it; it has no forward of its own).
class LlamaModelImpl : public torch::nn::Module {
 public:
  /// Registers the embedding, `config.layers` decoder layers and the final norm.
  explicit LlamaModelImpl(const LlamaConfig& config);
  torch::nn::Embedding embed_tokens{nullptr};  ///< the token embedding (vocab x C)
  torch::nn::ModuleList layers{nullptr};  ///< the decoder layers (LlamaDecoderLayer), in order
  LlamaRMSNorm norm{nullptr};  ///< the final norm
};
/// The module holder of LlamaModelImpl.
TORCH_MODULE(LlamaModel);

/// The whole model (Hugging Face's LlamaForCausalLM): its parameters are
/// model.embed_tokens.weight, model.layers.{i}.{input_layernorm,
/// post_attention_layernorm}.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
/// model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight and
/// lm_head.weight (with tie_word_embeddings the embedding's own tensor), and
/// with the switches self_attn.{q,k,v,o}_proj.bias, self_attn.{q,k}_norm.weight,
/// and self_attn.qkv_proj.weight and mlp.gate_up_proj.weight for the fused ones.
class LlamaImpl : public LanguageModel {
 public:
  /// Validates `config` and registers the modules (initialize with init_weights()).
  explicit LlamaImpl(const LlamaConfig& config);
  /// Mean cross-entropy (in fp32) of next-token prediction; idx and targets are [B, T] int64.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) override;
  /// Over packed rows, normalised by `loss_divisor` (LanguageModel::forward).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets, const SequencePacking& packing,
                        double loss_divisor) override;
  /// The next-token logits of [B, T] int64 idx: [B, T, vocab].
  torch::Tensor logits(const torch::Tensor& idx) override;
  /// Hugging Face's initialization of one parameter: norms' gains one,
  /// every matrix and the embedding N(0, 0.02).
  void init_parameter(const std::string& name, torch::Tensor& param) const override;
  /// The dimensions it was built with.
  const LlamaConfig& config() const { return config_; }
  int64_t vocab() const override { return config_.vocab; }  ///< config().vocab
  int64_t context() const override { return config_.context; }  ///< config().context
  ModelKind kind() const override { return ModelKind::kLlama; }  ///< ModelKind::kLlama
  std::string describe() const override { return config_.describe(); }  ///< config().describe()
  /// config().plan_description()
  ModelDescription plan_description() const override { return config_.plan_description(); }

  LlamaModel model{nullptr};  ///< embeddings, layers and the final norm
  torch::nn::Linear lm_head{nullptr};  ///< C -> vocab, no bias, when not tied (else null)
  /// With tie_word_embeddings, the head registered as "lm_head" whose weight
  /// is model.embed_tokens.weight itself (else null).
  TiedLMHead tied_lm_head{nullptr};

 private:
  /// The final norm's output [B, T, C]: what the head turns into logits.
  torch::Tensor final_hidden(const torch::Tensor& idx, const SequencePacking& packing = SequencePacking());
  LlamaConfig config_;
};
/// The module holder of LlamaImpl: what fully_shard() takes.
TORCH_MODULE(Llama);

}  // namespace fsdp::models
