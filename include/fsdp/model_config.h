#pragma once
/// \file
/// One model's configuration, of whichever family (language_model.h's
/// ModelKind): what the trainer, the planner and the Hugging Face adapters
/// pass around instead of a family's name and one config per family. Adding a
/// family adds its config type to the variant, its model file in src/models/
/// and its Hugging Face adapter beside it.

#include <memory>
#include <string>
#include <variant>

#include "fsdp/gpt.h"
#include "fsdp/language_model.h"
#include "fsdp/llama.h"
#include "fsdp/model_description.h"
#include "fsdp/wrap_policy.h"

namespace fsdp::models {

/// A model of any family: the family's own config, and what every family answers.
class ModelConfig {
 public:
  /// The reference GPT's default ("tiny") shape.
  ModelConfig() = default;
  /// A GPT's configuration (implicit: a GPT's config is a model config).
  ModelConfig(GPTConfig gpt) : family_(std::move(gpt)) {}  // NOLINT(google-explicit-constructor)
  /// A Llama's configuration (implicit, as the GPT's).
  ModelConfig(LlamaConfig llama) : family_(std::move(llama)) {}  // NOLINT(google-explicit-constructor)
  /// A configuration from its describe() text, which weight files and
  /// checkpoints record under "config" beside "model" (enum_name);
  /// throws naming a missing or unreadable field.
  static ModelConfig parse(ModelKind kind, const std::string& described);

  /// Its family.
  ModelKind kind() const { return static_cast<ModelKind>(family_.index()); }
  /// The GPT's config; throws unless kind() is kGpt.
  const GPTConfig& gpt() const;
  /// The Llama's config; throws unless kind() is kLlama.
  const LlamaConfig& llama() const;
  /// The dimensions every family has: vocab, context, layers, heads, width, batch.
  TransformerShape shape() const;
  /// Sets the training context: the sequence length a run trains on (for a
  /// model with rotary positions, free of what it was trained on before).
  void set_context(int64_t context);
  /// Sets the sequences per rank.
  void set_batch(int64_t batch);
  /// Sets how attention is computed (fsdp/attention.h), which no weight file records.
  void set_attention(AttentionKernel attention);
  /// How attention is computed.
  AttentionKernel attention() const;

  /// The family's describe() text.
  std::string describe() const;
  /// What the planner needs (the family's plan_description()).
  ModelDescription plan_description() const;
  /// A new model of this configuration (its weights not initialized).
  std::shared_ptr<LanguageModel> new_model() const;
  /// The wrap policy of one unit per transformer block (decoder layer), or
  /// with `per_sublayer` one per attention and one per MLP.
  WrapPolicy wrap_policy(bool per_sublayer) const;

 private:
  // In ModelKind's order: kind() is the index.
  std::variant<GPTConfig, LlamaConfig> family_;
};

}  // namespace fsdp::models
