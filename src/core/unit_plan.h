#pragma once
// Which modules become units: a wrap policy (fsdp/wrap_policy.h) applied to a
// module tree, as fully_shard and the models' descriptions apply it.

#include <set>

#include "fsdp/options.h"
#include "fsdp/wrap_policy.h"

namespace fsdp {

/// The outcome of applying a policy: units in the module tree's pre-order, the
/// root unit first. Parameters are listed once each (tied registrations
/// collapse to the first name in named_parameters order).
struct UnitPlan {
  std::string name;  ///< qualified module name, "" for the root
  torch::nn::Module* module = nullptr;  ///< the unit's module (the root's for the root unit)
  std::vector<std::pair<std::string, torch::Tensor>> params;  ///< (qualified name, parameter) it owns
};

/// Applies `policy` to the module tree of `root`: one UnitPlan per unit, the
/// root unit first; throws if a tied parameter would land in two units.
std::vector<UnitPlan> plan_units(torch::nn::Module& root, const WrapPolicy& policy);

/// A module's parameters with tied registrations collapsed to the first name
/// (in named_parameters order): the names state dicts and files use.
std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& module);

/// The frozen weights MixedPrecision::frozen_nf4 holds in NF4: the
/// registered `weight` of every torch::nn::Linear (LoRA's base) that
/// requires no gradient, but those of mixed_precision.nf4_skip_modules();
/// none without frozen_nf4. What fully_shard splits off and the planner counts.
std::set<const c10::TensorImpl*> nf4_weights(torch::nn::Module& root, const MixedPrecision& mixed_precision);

}  // namespace fsdp
