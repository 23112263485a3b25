// Applying a wrap policy to a module tree, and assigning parameters to units.

#include "fsdp/wrap_policy.h"
#include "core/unit_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace fsdp {
namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Post-order walk: children decide first, so a module sees only the
// parameters its inner units did not take.
int64_t select(torch::nn::Module& module, const std::string& name, bool is_root, const WrapPolicy& policy,
               std::map<std::string, torch::nn::Module*>& selected) {
  int64_t unwrapped = 0;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) unwrapped += p.value().numel();
  for (const auto& child : module.named_children()) {
    unwrapped += select(*child.value(), join(name, child.key()), false, policy, selected);
  }
  if (!is_root && policy && policy(name, module, unwrapped)) {
    selected[name] = &module;
    return 0;
  }
  return unwrapped;
}

// The innermost selected module whose subtree holds this parameter name.
std::string owning_unit(const std::string& param_name, const std::map<std::string, torch::nn::Module*>& selected) {
  std::string best;
  for (const auto& [unit_name, module] : selected) {
    bool inside = param_name.size() > unit_name.size() && param_name.compare(0, unit_name.size(), unit_name) == 0 &&
                  param_name[unit_name.size()] == '.';
    if (inside && unit_name.size() > best.size()) best = unit_name;
  }
  return best;  // "" = root
}

std::string display(const std::string& unit) { return unit.empty() ? "the root unit" : "unit '" + unit + "'"; }

}  // namespace

WrapPolicy min_params_policy(int64_t min_numel) {
  TORCH_CHECK(min_numel > 0, "min_params_policy: the minimum must be positive, got ", min_numel);
  return [min_numel](const std::string&, const torch::nn::Module&, int64_t unwrapped) {
    return unwrapped >= min_numel;
  };
}

WrapPolicy any_policy(std::vector<WrapPolicy> policies) {
  return [policies = std::move(policies)](const std::string& name, const torch::nn::Module& m, int64_t n) {
    for (const auto& p : policies)
      if (p(name, m, n)) return true;
    return false;
  };
}

std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) unique.emplace_back(p.key(), p.value());
  }
  return unique;
}

std::vector<UnitPlan> plan_units(torch::nn::Module& root, const WrapPolicy& policy) {
  std::map<std::string, torch::nn::Module*> selected;
  select(root, "", true, policy, selected);

  std::vector<UnitPlan> plans;
  std::unordered_map<std::string, size_t> plan_index;
  auto add_plan = [&](const std::string& name, torch::nn::Module* module) {
    plan_index[name] = plans.size();
    plans.push_back(UnitPlan{name, module, {}});
  };
  add_plan("", &root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (selected.count(item.key())) add_plan(item.key(), item.value().get());
  }

  // Every registration of the same tensor must resolve to the same unit.
  struct FirstSeen {
    std::string name;
    std::string unit;
  };
  std::unordered_map<const c10::TensorImpl*, FirstSeen> seen;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    std::string unit = owning_unit(p.key(), selected);
    auto [it, inserted] = seen.try_emplace(p.value().unsafeGetTensorImpl(), FirstSeen{p.key(), unit});
    if (inserted) {
      plans[plan_index.at(unit)].params.emplace_back(p.key(), p.value());
    } else {
      TORCH_CHECK(it->second.unit == unit, "the wrap policy splits a tied parameter: '", it->second.name, "' (in ",
                  display(it->second.unit), ") and '", p.key(), "' (in ", display(unit),
                  ") are the same tensor, and a tied parameter must live in one unit. Change the policy so that "
                  "both registrations fall in the same unit (e.g. leave both to the root).");
    }
  }
  return plans;
}

std::set<const c10::TensorImpl*> nf4_weights(torch::nn::Module& root, const MixedPrecision& mixed_precision) {
  std::set<const c10::TensorImpl*> weights;
  if (!mixed_precision.frozen_nf4()) return weights;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (!dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) continue;
    // The registered parameter: LoRA leaves the Linear's `weight` member
    // undefined (lora.h), so that nothing computes with the base alone.
    const auto own = item.value()->named_parameters(/*recurse=*/false);
    const torch::Tensor* weight = own.find("weight");
    if (!weight || !weight->defined()) continue;
    const std::string& name = item.key();
    const auto& skip = mixed_precision.nf4_skip_modules();
    const bool skipped = std::any_of(skip.begin(), skip.end(), [&](const std::string& s) {
      return name == s || (name.size() > s.size() && name.compare(name.size() - s.size() - 1, std::string::npos, "." + s) == 0);
    });
    if (!skipped && !weight->requires_grad()) weights.insert(weight->unsafeGetTensorImpl());
  }
  return weights;
}

}  // namespace fsdp
