#include "fsdp/state_dict.h"

#include <csignal>
#include <cstdlib>
#include <set>

#include "fsdp/compat.h"
#include "fsdp/error.h"
#include "fsdp/memory.h"
#include "fsdp/safetensors.h"

namespace fsdp {

void load_full_weights(torch::nn::Module& module, const std::string& path) {
  safetensors::Reader reader(path);
  if (reader.has_checksum()) reader.verify_checksum();
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

std::string optimizer_tensor_name(const std::string& param, const std::string& moment) {
  return param + "." + moment;
}

torch::optim::AdamWParamState& adamw_state(torch::optim::AdamW& optimizer, const torch::Tensor& shard) {
  auto key = compat::optimizer_state_key(optimizer, shard);
  auto& slot = optimizer.state()[key];
  if (!slot) {
    memory::MemoryCategoryScope scope(memory::Category::kOptimizerState);
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->exp_avg(torch::zeros_like(shard.detach()));
    fresh->exp_avg_sq(torch::zeros_like(shard.detach()));
    slot = std::move(fresh);
  }
  auto* state = dynamic_cast<torch::optim::AdamWParamState*>(slot.get());
  TORCH_CHECK(state, "expected AdamW state for the shard, found the state of another optimizer");
  return *state;
}

void maybe_kill_for_test(int rank) {
  static const char* spec = std::getenv("FSDP_TEST_KILL_IN_SAVE");
  static int saves = 0;
  if (!spec) return;
  int victim = -1, nth = -1;
  if (std::sscanf(spec, "%d:%d", &victim, &nth) == 2 && victim == rank && ++saves == nth) std::raise(SIGKILL);
}

void save_full_state_dict(FsdpState& state, const std::string& model_path,
                          const std::map<std::string, std::string>& metadata, torch::optim::AdamW* optimizer,
                          const std::string& optimizer_path) {
  state.check_idle();
  TORCH_CHECK(!optimizer || !optimizer_path.empty(), "save_full_state_dict: an optimizer needs an optimizer_path");
  const ProcessGroupPtr& group = state.group();
  std::unique_ptr<safetensors::Writer> model_writer, optimizer_writer;
  std::string error;
  if (group->rank() == 0) {
    try {
      // File order: unit by unit; in the optimizer file a unit's exp_avg
      // of every parameter, then its exp_avg_sq (one gathered moment at a time).
      std::vector<safetensors::TensorSpec> params, moments;
      for (const auto& unit : state.units()) {
        for (const auto& e : unit->flat_param().entries()) params.push_back({e.name, torch::kFloat, e.shape});
        for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
          for (const auto& e : unit->flat_param().entries()) {
            moments.push_back({optimizer_tensor_name(e.name, moment), torch::kFloat, e.shape});
          }
        }
      }
      model_writer = std::make_unique<safetensors::Writer>(model_path, std::move(params), metadata);
      if (optimizer) {
        auto optimizer_metadata = metadata;
        const int64_t step =
            state.units().empty() ? 0 : adamw_state(*optimizer, state.units()[0]->flat_param().shard()).step();
        optimizer_metadata["adamw_step"] = std::to_string(step);
        optimizer_writer = std::make_unique<safetensors::Writer>(optimizer_path, std::move(moments), optimizer_metadata);
      }
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  throw_if_any_rank_failed(group, error);
  auto stream = [&](const FlatParam& flat, const torch::Tensor& local, safetensors::Writer* writer) {
    torch::Tensor full = flat.gather_full(local);
    if (!writer || !error.empty()) return;  // the other ranks keep joining the gathers
    try {
      for (const auto& e : flat.entries()) writer->write(full.narrow(0, e.offset, e.numel).view(e.shape));
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  };
  for (size_t u = 0; u < state.units().size(); ++u) {
    const FlatParam& flat = state.units()[u]->flat_param();
    stream(flat, flat.shard(), model_writer.get());  // the fp32 masters, not the compute-dtype copies
    if (optimizer) {
      auto& adam = adamw_state(*optimizer, flat.shard());
      stream(flat, adam.exp_avg(), optimizer_writer.get());
      stream(flat, adam.exp_avg_sq(), optimizer_writer.get());
    }
    if (u == 0) maybe_kill_for_test(group->rank());
  }
  try {
    if (model_writer && error.empty()) model_writer->commit();
    if (optimizer_writer && error.empty()) optimizer_writer->commit();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  if (!error.empty() && model_writer && optimizer_writer) std::remove(model_path.c_str());  // both or neither
  model_writer.reset();  // an uncommitted file is removed
  optimizer_writer.reset();
  throw_if_any_rank_failed(group, error);
}

}  // namespace fsdp
