// What a model tells the planner of itself (fsdp/model_description.h): its
// shape's units, checked before any is listed, and the units fully_shard
// makes of a built model.

#include "fsdp/model_description.h"

#include <algorithm>
#include <numeric>

#include "base/strings.h"
#include "core/host_resources.h"
#include "models/unit_lists.h"
#include "core/unit_plan.h"

namespace fsdp {

namespace {

// The shape's counts as the planner multiplies them, checked before any is
// computed in 64 bits or listed: dimensions positive; its parameters' and
// activations' bytes (with room for the factors the estimates apply) within
// int64; its list of units no more than this host can hold. A shape beyond
// these overflowed into negative sizes, or listed two billion units until
// the kernel's OOM killer ended fsdp-plan.
void check_shape(const TransformerShape& s) {
  TORCH_CHECK(s.vocab > 0 && s.context > 0 && s.layers > 0 && s.heads > 0 && s.width > 0 && s.batch > 0,
              "every dimension of the planned model must be positive, got vocab ", s.vocab, ", context ", s.context,
              ", layers ", s.layers, ", heads ", s.heads, ", width ", s.width, ", batch ", s.batch);
  const long double V = s.vocab, T = s.context, L = s.layers, H = s.heads, C = s.width, B = s.batch;
  const long double params = V * C + T * C + 2 * C + L * (12 * C * C + 17 * C);
  // Activations: per block's token its width many times over and its heads'
  // scores; the logits and their gradient.
  const long double activations = B * T * (L * (64 * C + 16 * H * T) + 16 * V);
  const long double limit = static_cast<long double>(int64_t{1} << 62);
  TORCH_CHECK(params * 64 < limit && activations < limit, "the planned model (vocab ", s.vocab, ", context ", s.context,
              ", layers ", s.layers, ", heads ", s.heads, ", width ", s.width, ", batch ", s.batch, ") has ",
              static_cast<double>(params), " parameters and ", static_cast<double>(activations),
              " bytes of activations: beyond what 64-bit byte counts hold");
  check_unit_lists_fit((s.sublayer_units ? 2 : 1) * s.layers + 1, s.layers);
}

}  // namespace

void check_unit_lists_fit(int64_t units, int64_t layers) {
  // The planner keeps a few lists of one int64 per unit: 16 is a bound.
  const int64_t list_bytes = units * static_cast<int64_t>(sizeof(int64_t)) * 16;
  const int64_t available = host_memory_available();
  TORCH_CHECK(list_bytes <= available, "the planned model has ", units, " units (layers ", layers,
              "): the planner's lists of them alone take ", format_mib(list_bytes), ", beyond this host's ",
              format_mib(available), " available");
}

std::vector<int64_t> TransformerShape::unit_numels() const {
  check_shape(*this);
  const int64_t C = width;
  std::vector<int64_t> numels = {vocab * C + context * C + 2 * C};  // wte (tied with the head), wpe, ln_f
  for (int64_t i = 0; i < layers; ++i) {
    if (!sublayer_units) {
      numels.push_back(12 * C * C + 13 * C);
      continue;
    }
    numels[0] += 4 * C;                  // the block's two norms
    numels.push_back(4 * C * C + 4 * C);  // attention: c_attn, c_proj
    numels.push_back(8 * C * C + 5 * C);  // MLP: c_fc, c_proj
  }
  return numels;
}

int64_t ModelDescription::num_parameters() const {
  return num_trainable() + std::accumulate(layer_frozen.begin(), layer_frozen.end(), int64_t{0});
}

int64_t ModelDescription::num_trainable() const {
  return std::accumulate(layer_units.begin(), layer_units.end(), int64_t{0});
}

void ModelDescription::describe_units(bool sublayer, torch::nn::Module& model, const WrapPolicy& policy) {
  std::vector<int64_t> trainable, frozen, nf4;
  bool any_frozen = false, any_nf4 = false;
  const auto quantizable = nf4_weights(model, MixedPrecision().frozen_nf4(true));
  for (const UnitPlan& unit : plan_units(model, policy)) {
    trainable.push_back(0);
    frozen.push_back(0);
    nf4.push_back(0);
    // fully_shard's split (split_frozen_parameters): by requires_grad, and the frozen linear weights.
    for (const auto& [name, param] : unit.params) {
      (param.requires_grad() ? trainable : frozen).back() += param.numel();
      if (quantizable.count(param.unsafeGetTensorImpl())) nf4.back() += (param.numel() + 63) / 64 * 64;
    }
    any_frozen = any_frozen || frozen.back() > 0;
    any_nf4 = any_nf4 || nf4.back() > 0;
  }
  if (!any_frozen) frozen.clear();  // planned exactly as a model that freezes nothing
  if (!any_nf4) nf4.clear();
  (sublayer ? sublayer_nf4 : layer_nf4) = std::move(nf4);
  (sublayer ? sublayer_units : layer_units) = std::move(trainable);
  (sublayer ? sublayer_frozen : layer_frozen) = std::move(frozen);
}

}  // namespace fsdp
