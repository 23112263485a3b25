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

namespace {

// Rank 0 alone touches the file; every rank learns whether it failed, so
// that all of them throw rather than some waiting for a collective.
void agree_on_failure(const ProcessGroupPtr& group, const std::string& error, const std::string& path) {
  torch::Tensor failed = torch::tensor({error.empty() ? 0 : 1}, torch::kInt);
  group->all_reduce(failed, ReduceOp::kSum)->wait();
  if (failed.item<int>() == 0) return;
  TORCH_CHECK(false, error.empty() ? "rank 0 could not write '" + path + "'" : error);
}

}  // namespace

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
  agree_on_failure(group, error, path);
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
  agree_on_failure(group, error, path);
}
}  // namespace fsdp
