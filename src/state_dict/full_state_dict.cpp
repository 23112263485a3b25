#include "fsdp/state_dict.h"

#include <set>

#include "fsdp/error.h"
#include "fsdp/safetensors.h"

namespace fsdp {

void load_full_weights(torch::nn::Module& module, const std::string& path) {
  safetensors::Reader reader(path);
  auto params = unique_named_parameters(module);
  std::set<std::string> expected;
  std::vector<torch::Tensor> values;
  for (const auto& [name, param] : params) {
    expected.insert(name);
    const safetensors::TensorEntry* entry = reader.find(name);
    TORCH_CHECK(entry, "'", path, "' has no tensor '", name, "' (expected shape ", param.sizes(), ")");
    TORCH_CHECK(entry->spec.shape == param.sizes().vec(), "'", path, "': tensor '", name, "' has shape ",
                c10::IntArrayRef(entry->spec.shape), ", expected ", param.sizes());
    TORCH_CHECK(c10::isFloatingType(entry->spec.dtype), "'", path, "': tensor '", name, "' has dtype ",
                entry->spec.dtype, ", expected a floating-point type");
    values.push_back(reader.read(name));
  }
  for (const auto& t : reader.tensors()) {
    TORCH_CHECK(expected.count(t.spec.name), "'", path, "' has a tensor '", t.spec.name,
                "' that the model does not have");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(values[i]);
}


void save_full_weights(FsdpState& state, const std::string& path, const std::map<std::string, std::string>& metadata) {
  state.check_idle();
  const ProcessGroupPtr& group = state.group();
  std::unique_ptr<safetensors::Writer> writer;
  std::string error;
  if (group->rank() == 0) {
    try {
      std::vector<safetensors::TensorSpec> specs;
      for (const auto& unit : state.units()) {
        for (const auto& e : unit->flat_param().entries()) specs.push_back({e.name, torch::kFloat, e.shape});
      }
      writer = std::make_unique<safetensors::Writer>(path, std::move(specs), metadata);
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  throw_if_any_rank_failed(group, error);
  // One unit at a time, from the fp32 masters (not the compute-dtype copies).
  for (const auto& unit : state.units()) {
    const FlatParam& flat = unit->flat_param();
    torch::Tensor full = flat.gather_full_master();
    if (!writer || !error.empty()) continue;  // keep joining the gathers
    try {
      for (const auto& e : flat.entries()) writer->write(full.narrow(0, e.offset, e.numel).view(e.shape));
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  if (writer && error.empty()) {
    try {
      writer->commit();
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  writer.reset();  // an uncommitted file is removed
  throw_if_any_rank_failed(group, error);
}
}  // namespace fsdp
