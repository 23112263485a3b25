#pragma once
/// \file
/// What the trainer, sharded initialization, evaluation and sampling need of
/// a causal language model: the reference GPT (gpt.h) and the Llama (llama.h)
/// both are one, so that fully_shard and fsdp-train treat them alike.

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "fsdp/attention.h"
#include "fsdp/model_description.h"
#include "fsdp/enum_names.h"

namespace fsdp::models {

/// The model families: what fsdp-train's --model names, and what weight
/// files and checkpoints record as their "model". Each has one config type
/// (model_config.h) and one Hugging Face adapter.
/// Named by enum_name, parsed by parse_enum: "gpt", "llama".
enum class ModelKind {
  kGpt,    ///< "gpt": the reference GPT (gpt.h), Hugging Face's GPT-2
  kLlama,  ///< "llama": the Llama (llama.h), Hugging Face's Llama
};
}  // namespace fsdp::models
namespace fsdp::detail {
const EnumNames& enum_names(EnumTag<models::ModelKind>);  ///< "gpt", "llama"
}  // namespace fsdp::detail
namespace fsdp::models {

/// logits = x @ weight^T, with `weight` registered as the very tensor it is
/// tied to (the token embedding), so that both names are one parameter: the GPT's
/// head, and a Llama's with tie_word_embeddings.
class TiedLMHeadImpl : public torch::nn::Module {
 public:
  /// Registers `tied_weight` itself (not a copy) as "weight".
  explicit TiedLMHeadImpl(const torch::Tensor& tied_weight);
  /// x @ weight^T: [B, T, C] -> [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  ///< the token embedding's weight
};
/// The module holder of TiedLMHeadImpl.
TORCH_MODULE(TiedLMHead);

/// The mean next-token cross-entropy, in fp32 whatever the compute dtype, of
/// logits = hidden @ weight^T: hidden [B, T, C] (or [M, C]), weight
/// [vocab, C], targets [B, T] (or [M]) int64, -100 ignored as in
/// torch::nn::functional::cross_entropy. Where the rows fit in one slice
/// (of at most 2^23 logits) it is exactly cross_entropy(linear(hidden, weight)).
/// Else it runs slice by slice, and where a gradient is wanted computes it
/// in forward from each slice's probabilities (as Liger's fused linear
/// cross-entropy does): the B x T x vocab logits, their fp32 copy and their
/// gradients never exist whole, nothing is recomputed, and backward only
/// scales the gradients kept (hidden's, and the head's in fp32) by the
/// upstream gradient, once: retain_graph through it is refused. The same
/// loss and gradients to float rounding (only the order of the sums differs).
/// With `loss_divisor` > 0 the loss is the targets' summed cross-entropy
/// divided by it instead of their mean (a loss normalised over a global
/// batch's targets: TrainStep::token_loss_divisor), and 0 where every target is -100.
torch::Tensor next_token_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                              double loss_divisor = 0.0);

/// A next-token language model over token ids 0 ... vocab() - 1.
class LanguageModel : public torch::nn::Module {
 public:
  /// Mean cross-entropy (in fp32) of next-token prediction; idx and targets are [B, T] int64.
  virtual torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) = 0;
  /// The same loss over packed rows (several sequences a row, each attending
  /// only to itself, positions restarting: SequencePacking), summed over the
  /// targets that are not -100 and divided by `loss_divisor` where it is
  /// positive (next_token_loss), their mean where it is 0.
  virtual torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets,
                                const SequencePacking& packing, double loss_divisor) = 0;
  /// The next-token logits of [B, T] int64 idx: [B, T, vocab].
  virtual torch::Tensor logits(const torch::Tensor& idx) = 0;
  /// One parameter's initial values, drawn from the global RNG: init_weights
  /// seeds it and calls this for every parameter in named order; sharded
  /// initialization (FullyShardOptions::param_init_fn) calls it the same way.
  virtual void init_parameter(const std::string& name, torch::Tensor& param) const = 0;
  /// The seeded initialization: torch::manual_seed(seed), then init_parameter
  /// for every parameter in named order (a tied one once); the same for every world size.
  void init_weights(uint64_t seed);
  /// The parameters' element count, a tied one counted once.
  int64_t num_parameters() const;
  /// The vocabulary size: token ids are 0 ... vocab() - 1.
  virtual int64_t vocab() const = 0;
  /// The longest sequence it takes (its training context).
  virtual int64_t context() const = 0;
  /// Its family.
  virtual ModelKind kind() const = 0;
  /// "gpt" or "llama": enum_name(kind()), what fsdp-train's --model calls it.
  std::string model_type() const { return enum_name(kind()); }
  /// Its configuration in words (the config's describe()).
  virtual std::string describe() const = 0;
  /// What the planner needs of it (the config's plan_description()): its
  /// shape, its units' sizes, its activations beyond the reference GPT's.
  virtual ModelDescription plan_description() const = 0;
};

}  // namespace fsdp::models
