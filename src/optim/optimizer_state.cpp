#include "optim/optimizer_state.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <typeinfo>

#include "base/compat.h"
#include "fsdp/memory.h"

namespace fsdp {
namespace {

template <class Options>
bool any_group(const torch::optim::Optimizer& optimizer, bool (*predicate)(const Options&)) {
  for (const auto& group : optimizer.param_groups()) {
    if (predicate(static_cast<const Options&>(group.options()))) return true;
  }
  return false;
}

template <class Options>
bool all_groups(const torch::optim::Optimizer& optimizer, bool (*predicate)(const Options&)) {
  for (const auto& group : optimizer.param_groups()) {
    if (!predicate(static_cast<const Options&>(group.options()))) return false;
  }
  return true;
}

// Adam's and AdamW's state classes are distinct but alike.
template <class ParamState>
torch::Tensor& adam_tensor(ParamState& s, const std::string& name) {
  if (name == "exp_avg") return s.exp_avg();
  if (name == "exp_avg_sq") return s.exp_avg_sq();
  return s.max_exp_avg_sq();
}

template <class ParamState>
std::unique_ptr<ParamState> fresh_adam_state(const torch::Tensor& param, bool amsgrad) {
  auto state = std::make_unique<ParamState>();
  state->step(0);
  state->exp_avg(torch::zeros_like(param.detach()));
  state->exp_avg_sq(torch::zeros_like(param.detach()));
  if (amsgrad) state->max_exp_avg_sq(torch::zeros_like(param.detach()));
  return state;
}

}  // namespace

std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  const char* mangled = typeid(optimizer).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  return name;
}

OptimizerState::OptimizerState(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  using namespace torch::optim;
  if (dynamic_cast<AdamW*>(&optimizer) || dynamic_cast<Adam*>(&optimizer)) {
    const bool adamw = dynamic_cast<AdamW*>(&optimizer) != nullptr;
    type_ = adamw ? "adamw" : "adam";
    tensor_names_ = {"exp_avg", "exp_avg_sq"};
    const bool amsgrad =
        adamw ? any_group<AdamWOptions>(optimizer, [](const AdamWOptions& o) { return o.amsgrad(); })
              : any_group<AdamOptions>(optimizer, [](const AdamOptions& o) { return o.amsgrad(); });
    if (amsgrad) tensor_names_.push_back("max_exp_avg_sq");
  } else if (dynamic_cast<SGD*>(&optimizer)) {
    type_ = "sgd";
    const bool momentum = any_group<SGDOptions>(optimizer, [](const SGDOptions& o) { return o.momentum() != 0; });
    const bool all_momentum = all_groups<SGDOptions>(optimizer, [](const SGDOptions& o) { return o.momentum() != 0; });
    TORCH_CHECK(momentum == all_momentum, "fsdp: an SGD optimizer whose parameter groups mix momentum and none ",
                "cannot be sharded (every shard must keep the same state)");
    if (momentum) tensor_names_ = {"momentum_buffer"};
  } else {
    TORCH_CHECK(false, "fsdp: the optimizer ", optimizer_name(optimizer),
                " keeps state that fsdp-cpp cannot shard, checkpoint or reshard (supported: torch::optim::Adam, "
                "torch::optim::AdamW, torch::optim::SGD, whose state is element-wise)");
  }
}

bool OptimizerState::has_state(const torch::Tensor& param) const {
  const auto& state = optimizer_.state();
  auto it = state.find(compat::optimizer_state_key(optimizer_, param));
  return it != state.end() && it->second;
}

int64_t OptimizerState::step(const torch::Tensor& param) const {
  if (type_ == "sgd" || !has_state(param)) return 0;
  auto& slot = optimizer_.state().at(compat::optimizer_state_key(optimizer_, param));
  if (type_ == "adamw") return static_cast<torch::optim::AdamWParamState&>(*slot).step();
  return static_cast<torch::optim::AdamParamState&>(*slot).step();
}

torch::Tensor OptimizerState::value(const torch::Tensor& param, const std::string& name) const {
  if (!has_state(param)) return torch::zeros_like(param.detach());
  return const_cast<OptimizerState*>(this)->tensor(param, name);
}

torch::Tensor OptimizerState::tensor(const torch::Tensor& param, const std::string& name) {
  TORCH_CHECK(std::find(tensor_names_.begin(), tensor_names_.end(), name) != tensor_names_.end(), "fsdp: ",
              optimizer_name(optimizer_), " has no state '", name, "'");
  auto& slot = optimizer_.state()[compat::optimizer_state_key(optimizer_, param)];
  const bool amsgrad = tensor_names_.size() == 3;
  memory::MemoryCategoryScope scope(memory::Category::kOptimizerState);
  if (type_ == "adamw") {
    if (!slot) slot = fresh_adam_state<torch::optim::AdamWParamState>(param, amsgrad);
    auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
    if (name == "max_exp_avg_sq" && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(torch::zeros_like(param.detach()));
    return adam_tensor(s, name);
  }
  if (type_ == "adam") {
    if (!slot) slot = fresh_adam_state<torch::optim::AdamParamState>(param, amsgrad);
    auto& s = static_cast<torch::optim::AdamParamState&>(*slot);
    if (name == "max_exp_avg_sq" && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(torch::zeros_like(param.detach()));
    return adam_tensor(s, name);
  }
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::SGDParamState>();
    fresh->momentum_buffer(torch::zeros_like(param.detach()));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
}

void OptimizerState::set_step(const torch::Tensor& param, int64_t step) {
  if (type_ == "sgd") return;
  if (!tensor_names_.empty()) tensor(param, tensor_names_.front());  // makes the state
  auto& slot = optimizer_.state().at(compat::optimizer_state_key(optimizer_, param));
  if (type_ == "adamw") {
    static_cast<torch::optim::AdamWParamState&>(*slot).step(step);
  } else {
    static_cast<torch::optim::AdamParamState&>(*slot).step(step);
  }
}

void OptimizerState::clear(const torch::Tensor& param) {
  optimizer_.state().erase(compat::optimizer_state_key(optimizer_, param));
}

}  // namespace fsdp
