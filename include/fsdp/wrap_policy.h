#pragma once
/// \file
/// Wrap policies: which modules of a model become FSDP units. Each unit owns
/// the parameters registered under it that no inner unit owns; the rest belong
/// to the root unit. A parameter registered in two places (tied weights) must
/// land in one unit, or sharding is refused.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

/// Called bottom-up for every module below the root: its qualified name, the
/// module, and how many parameter elements of its subtree no inner unit took.
using WrapPolicy =
    std::function<bool(const std::string& qualified_name, const torch::nn::Module& module, int64_t unwrapped_numel)>;

/// The transformer-block policy: every module of one of the given Impl types
/// becomes a unit (for example `module_type_policy<models::BlockImpl>()`).
template <class... ModuleTypes>
WrapPolicy module_type_policy() {
  return [](const std::string&, const torch::nn::Module& module, int64_t) {
    return (... || (dynamic_cast<const ModuleTypes*>(&module) != nullptr));
  };
}

/// A module becomes a unit once the parameters not yet in a unit below it
/// reach min_numel elements (PyTorch's size_based_auto_wrap_policy).
WrapPolicy min_params_policy(int64_t min_numel);

/// A module becomes a unit if any of the policies says so.
WrapPolicy any_policy(std::vector<WrapPolicy> policies);

}  // namespace fsdp
