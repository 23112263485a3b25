#include "fsdp/state_dict.h"
#include "core/fsdp_state_impl.h"
#include "core/flat_param.h"
#include "core/nf4.h"
#include "state_dict/save_faults.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <set>
#include <utility>

#include "base/compat.h"
#include "fsdp/error.h"
#include "fsdp/memory.h"
#include "core/shard_offload.h"
#include "optim/optimizer_state.h"
#include "fsdp/safetensors.h"
#include "state_dict/checkpoint_schema.h"
#include "state_dict/load_shards.h"
#include "core/unit_plan.h"

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

std::string optimizer_tensor_name(const std::string& param, const std::string& state_name) {
  return param + "." + state_name;
}

StateDict full_state_dict(FsdpState& state, FullStateDictOptions options) {
  settle_between_steps(state);
  const bool keep = !options.rank0_only() || state.group()->rank() == 0;
  std::map<std::string, torch::Tensor> gathered;
  for (FlatParam* buffer : detail::flat_params(state)) {
    const FlatParam& flat = *buffer;
    ResidentScope resident(state, flat, nullptr, /*agree=*/true);
    // The fp32 masters, one unit at a time (a frozen part held in bf16: its values, exactly, in fp32).
    torch::Tensor full = flat.gather_full(flat.shard()).to(torch::kFloat);
    if (!keep) continue;
    for (const auto& e : flat.entries()) gathered[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape).clone();
  }
  StateDict dict;
  if (!keep) return dict;
  // The model's own order, as its named_parameters() (tied ones once).
  for (const auto& [name, param] : unique_named_parameters(state.module())) {
    auto it = gathered.find(name);
    if (it != gathered.end()) dict.insert(name, std::move(it->second));
  }
  return dict;
}

void load_full_state_dict(FsdpState& state, const StateDict& dict) {
  settle_between_steps(state);
  // Everything is checked before anything changes.
  size_t expected = 0;
  for (const FlatParam* flat : detail::flat_params(state)) {
    for (const auto& e : flat->entries()) {
      ++expected;
      const torch::Tensor* value = dict.find(e.name);
      TORCH_CHECK(value, "load_full_state_dict: the state dict has no '", e.name, "' (expected shape ",
                  c10::IntArrayRef(e.shape), ")");
      TORCH_CHECK(value->sizes().vec() == e.shape && value->is_floating_point(), "load_full_state_dict: '", e.name,
                  "' is ", value->scalar_type(), " of shape ", value->sizes(), ", expected a float tensor of shape ",
                  c10::IntArrayRef(e.shape));
    }
  }
  if (dict.size() != expected) {
    for (const auto& item : dict) {
      bool known = false;
      for (const FlatParam* flat : detail::flat_params(state))
        for (const auto& e : flat->entries()) known = known || e.name == item.key();
      TORCH_CHECK(known, "load_full_state_dict: the model has no parameter '", item.key(), "'");
    }
  }
  load_shards(state, [&](const std::string& name, int64_t offset, torch::Tensor& out) {
    out.copy_(dict[name].detach().reshape({-1}).narrow(0, offset, out.numel()));
  });
}

namespace {
// load_shards for a unit's NF4 weights: this rank's blocks of each weight
// read in fp32 and quantized, one weight's piece at a time (blocks are
// independent, and a shard begins on a block boundary, as every weight does).
void load_nf4_shard(FlatParam& flat, const ParameterReader& read, const ParameterFilter& only) {
  const int64_t begin = flat.shard_rank() * flat.shard_numel(), end = begin + flat.shard_numel();
  torch::Tensor records = flat.shard().detach().cpu();
  if (!only) nf4::clear_records(records);
  for (const auto& e : flat.entries()) {
    if (only && !only(e.name)) continue;
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    torch::Tensor values = torch::empty({hi - lo}, torch::kFloat);
    read(e.name, lo - e.offset, values);
    nf4::quantize_into_records(values, records.narrow(0, (lo - begin) / nf4::kBlock * nf4::kRecordBytes,
                                                      nf4::blocks(hi - lo) * nf4::kRecordBytes));
  }
  if (!records.is_same(flat.shard())) flat.shard().detach().copy_(records);
  // (in place: the gathered copy is stale)
}
}  // namespace

void load_shards(FsdpState& state, const ParameterReader& read, const ParameterFilter& only) {
  settle_between_steps(state);
  torch::NoGradGuard no_grad;
  for (FlatParam* buffer : detail::flat_params(state)) {
    FlatParam& flat = *buffer;
    const auto& entries = flat.entries();
    const bool some = !only || std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return only(e.name); });
    if (!some) continue;  // a unit none of whose parameters is asked for is not even made resident
    ResidentScope resident(state, flat);
    // This rank's shard covers [begin, end) of the unit's flat elements.
    const int64_t begin = flat.shard_rank() * flat.shard_numel(), end = begin + flat.shard_numel();
    torch::Tensor shard = flat.shard().detach();
    if (flat.nf4()) {
      load_nf4_shard(flat, read, only);
      continue;
    }
    // The padding stays zero; the in-place writes mark the gathered copy stale.
    // A filtered load keeps the other parameters' values (the padding is zero already).
    if (!only) shard.zero_();
    for (const auto& e : entries) {
      if (only && !only(e.name)) continue;
      const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      if (lo >= hi) continue;
      torch::Tensor piece = shard.narrow(0, lo - begin, hi - lo);
      if (piece.device().is_cpu() && piece.scalar_type() == torch::kFloat) {
        read(e.name, lo - e.offset, piece);  // straight into the shard
      } else {
        torch::Tensor staged = torch::empty({hi - lo}, torch::kFloat);
        read(e.name, lo - e.offset, staged);
        piece.copy_(staged);
      }
    }
  }
}

ShardedStateDict sharded_state_dict(const FsdpState& state) {
  ShardedStateDict dict;
  for (FlatParam* buffer : detail::flat_params(state)) {
    const FlatParam& flat = *buffer;
    ResidentScope resident(state, flat);
    const int64_t begin = flat.shard_rank() * flat.shard_numel(), end = begin + flat.shard_numel();
    torch::Tensor values = flat.shard().detach();
    if (flat.nf4()) {  // the NF4 weights' values, dequantized
      torch::Tensor dequantized = torch::empty({flat.shard_numel()}, values.options().dtype(torch::kFloat));
      nf4::dequantize_records_into(values, dequantized);
      values = dequantized;
    }
    for (const auto& e : flat.entries()) {
      const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      if (lo >= hi) {
        dict.insert(e.name, ShardedTensor{e.shape, 0, torch::empty({0}, torch::kFloat)});
      } else {
        dict.insert(e.name, ShardedTensor{e.shape, lo - e.offset, values.narrow(0, lo - begin, hi - lo).to(torch::kFloat, false, /*copy=*/true)});
      }
    }
  }
  return dict;
}

void load_sharded_state_dict(FsdpState& state, const ShardedStateDict& dict) {
  settle_between_steps(state);
  const ShardedStateDict mine = sharded_state_dict(state);  // the layout this rank holds
  TORCH_CHECK(dict.size() == mine.size(), "load_sharded_state_dict: the state dict has ", dict.size(),
              " parameters, the model ", mine.size());
  for (const auto& item : mine) {
    const ShardedTensor* given = dict.find(item.key());
    TORCH_CHECK(given, "load_sharded_state_dict: the state dict has no '", item.key(), "'");
    const ShardedTensor& want = item.value();
    TORCH_CHECK(given->shape == want.shape && given->offset == want.offset && given->local.defined() &&
                    given->local.numel() == want.local.numel(),
                "load_sharded_state_dict: '", item.key(), "' holds elements [", given->offset, ", ",
                given->offset + (given->local.defined() ? given->local.numel() : 0), ") of shape ",
                c10::IntArrayRef(given->shape), "; this rank holds [", want.offset, ", ",
                want.offset + want.local.numel(), ") of shape ", c10::IntArrayRef(want.shape),
                " (saved with another world size, strategy or wrapping? use a full state dict or a checkpoint)");
  }
  torch::NoGradGuard no_grad;
  for (FlatParam* buffer : detail::flat_params(state)) {
    FlatParam& flat = *buffer;
    ResidentScope resident(state, flat);
    const int64_t begin = flat.shard_rank() * flat.shard_numel(), end = begin + flat.shard_numel();
    for (const auto& e : flat.entries()) {
      const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      if (lo < hi) flat.shard().detach().narrow(0, lo - begin, hi - lo).copy_(dict[e.name].local.reshape({-1}));
    }
  }
}

namespace detail {
void maybe_kill_for_test(int rank) {
  static int saves = 0;
  ++saves;
  for (auto [variable, signal] : {std::pair{"FSDP_TEST_KILL_IN_SAVE", SIGKILL}, {"FSDP_TEST_SIGNAL_IN_SAVE", SIGTERM}}) {
    const char* spec = std::getenv(variable);
    int victim = -1, nth = -1;
    if (spec && std::sscanf(spec, "%d:%d", &victim, &nth) == 2 && victim == rank && saves == nth) std::raise(signal);
  }
}
}  // namespace detail

namespace {

// save_full_state_dict's model file as a WeightWriter.
class SafetensorsWeights : public WeightWriter {
 public:
  SafetensorsWeights(const std::string& path, std::vector<safetensors::TensorSpec> specs,
                     const std::map<std::string, std::string>& metadata)
      : writer_(path, std::move(specs), metadata) {}
  void write(const torch::Tensor& tensor) override { writer_.write(tensor); }
  void commit() override { writer_.commit(); }

 private:
  safetensors::Writer writer_;
};

// The weights into the writer rank 0 opens with `open_model`, and the
// optimizer's state (when given) into `optimizer_path`, gathered one unit
// (and one kind of state) at a time. `remove_model` undoes a committed model
// output when the optimizer's commit fails: both or neither.
void stream_full(FsdpState& state, const OpenWeightWriter& open_model, torch::optim::Optimizer* optimizer,
                 const std::string& optimizer_path, const std::map<std::string, std::string>& metadata,
                 const std::function<void()>& remove_model) {
  settle_between_steps(state);  // the step counts and state the metadata reads
  std::optional<OptimizerState> optimizer_state;
  if (optimizer) optimizer_state.emplace(*optimizer);
  const ProcessGroupPtr& group = state.group();
  std::unique_ptr<WeightWriter> model_writer;
  std::unique_ptr<safetensors::Writer> optimizer_writer;
  std::string error;
  if (group->rank() == 0) {
    try {
      // File order: unit by unit; in the optimizer file a unit's first
      // state tensor (exp_avg) of every parameter, then the next (one
      // gathered state tensor at a time).
      std::vector<safetensors::TensorSpec> params, moments;
      for (const FlatParam* flat : detail::flat_params(state)) {
        for (const auto& e : flat->entries()) params.push_back({e.name, torch::kFloat, e.shape});
        if (!optimizer_state || flat->frozen()) continue;  // frozen: no optimizer state
        for (const auto& name : optimizer_state->tensor_names()) {
          for (const auto& e : flat->entries()) {
            moments.push_back({optimizer_tensor_name(e.name, name), torch::kFloat, e.shape});
          }
        }
      }
      model_writer = open_model(std::move(params));
      if (optimizer) {
        auto optimizer_metadata = metadata;
        optimizer_metadata["optimizer"] = optimizer_state->type();
        optimizer_metadata["optimizer_step"] =
            std::to_string(optimizer_state->step(detail::flat_params(state).front()->shard()));
        optimizer_writer = std::make_unique<safetensors::Writer>(optimizer_path, std::move(moments), optimizer_metadata);
      }
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  throw_if_any_rank_failed(group, error);
  auto stream = [&](const FlatParam& flat, const torch::Tensor& local, auto* writer) {
    torch::Tensor full = flat.gather_full(local).to(torch::kFloat);  // (a frozen part held in bf16: exact)
    if (!writer || !error.empty()) return;  // the other ranks keep joining the gathers
    try {
      for (const auto& e : flat.entries()) writer->write(full.narrow(0, e.offset, e.numel).view(e.shape));
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  };
  for (size_t u = 0; u < detail::flat_params(state).size(); ++u) {
    const FlatParam& flat = *detail::flat_params(state)[u];
    ResidentScope resident(state, flat, optimizer, /*agree=*/true);
    stream(flat, flat.shard(), model_writer.get());  // the fp32 masters, not the compute-dtype copies
    if (optimizer_state && !flat.frozen()) {
      for (const auto& name : optimizer_state->tensor_names()) {
        stream(flat, optimizer_state->value(flat.shard(), name), optimizer_writer.get());
      }
    }
    if (u == 0) detail::maybe_kill_for_test(group->rank());
  }
  try {
    if (model_writer && error.empty()) model_writer->commit();
    if (optimizer_writer && error.empty()) optimizer_writer->commit();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  if (!error.empty() && model_writer && optimizer_writer) remove_model();  // both or neither
  model_writer.reset();  // an uncommitted output is removed
  optimizer_writer.reset();
  throw_if_any_rank_failed(group, error);
}

}  // namespace

void save_full_weights(FsdpState& state, const OpenWeightWriter& open) {
  stream_full(state, open, nullptr, "", {}, [] {});
}

void save_full_state_dict(FsdpState& state, const std::string& model_path,
                          const std::map<std::string, std::string>& metadata, torch::optim::Optimizer* optimizer,
                          const std::string& optimizer_path) {
  TORCH_CHECK(!optimizer || !optimizer_path.empty(), "save_full_state_dict: an optimizer needs an optimizer_path");
  stream_full(
      state,
      [&](std::vector<safetensors::TensorSpec> specs) {
        return std::make_unique<SafetensorsWeights>(model_path, std::move(specs), metadata);
      },
      optimizer, optimizer_path, metadata, [&] { std::remove(model_path.c_str()); });
}

}  // namespace fsdp
