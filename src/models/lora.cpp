// LoRA adapters on a model's linears (fsdp/lora.h): registered under each
// linear as PEFT names them, applied by lora::forward.

#include "fsdp/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <set>

#include "base/strings.h"
#include "core/host_resources.h"
#include "fsdp/wrap_policy.h"
#include "models/lora_adapters.h"
#include "core/unit_plan.h"

namespace fsdp::lora {
namespace {

// An adapter's A (registered as "lora_A", its parameter "weight": r x in)
// and what its forward needs: the linear's own weight (the very tensor the
// linear registered, whose data fully_shard points into its gathered
// buffers) and the settings. B is a plain bias-free linear ("lora_B").
class LoraDownImpl : public torch::nn::Module {
 public:
  LoraDownImpl(const torch::Tensor& base_weight, int64_t rank, double alpha, double dropout)
      : base_weight(base_weight), rank(rank), alpha(alpha), dropout(dropout) {
    weight = register_parameter("weight", torch::empty({rank, base_weight.size(1)}, base_weight.options()));
  }
  torch::Tensor weight;
  torch::Tensor base_weight;
  torch::Tensor up_weight;  // B's, set by apply()
  int64_t rank;
  double alpha, dropout;
};

const std::string kDown = "lora_A", kUp = "lora_B";

// The adapter of `linear`, or null: apply() registered A first, then B.
LoraDownImpl* down_of(const torch::nn::Module& linear) {
  const auto children = linear.children();
  return children.empty() ? nullptr : children.front()->as<LoraDownImpl>();
}

bool matches(const std::string& name, const std::string& target) {
  return name == target || ends_with(name, "." + target);
}

// FNV-1a 64 of the name, mixed with the seed by SplitMix64's finalizer: a
// generator seed that depends on nothing but the two.
uint64_t name_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

bool is_adapter_parameter(const std::string& name) {
  return ends_with(name, "." + kDown + ".weight") || ends_with(name, "." + kUp + ".weight");
}

void init_parameter(const std::string& name, torch::Tensor& param, uint64_t seed) {
  TORCH_CHECK(is_adapter_parameter(name), "lora::init_parameter: '", name,
              "' is not an adapter's parameter (expected a name ending with .lora_A.weight or .lora_B.weight)");
  torch::NoGradGuard no_grad;
  if (ends_with(name, "." + kUp + ".weight")) {
    param.zero_();
    return;
  }
  // Drawn in fp32 on the CPU whatever the parameter is: the same values everywhere.
  const double bound = 1.0 / std::sqrt(static_cast<double>(param.size(1)));
  at::Generator generator = at::detail::createCPUGenerator(name_seed(name, seed));
  torch::Tensor values = torch::empty(param.sizes(), torch::kFloat);
  values.uniform_(-bound, bound, generator);
  param.copy_(values);
}

namespace {

// The adapters' bytes, r (in + out) fp32 elements a linear, against what the
// host has, before any is allocated: a rank of a billion (a typo, a lying
// adapter_config.json) once asked the allocator for hundreds of GiB and
// failed naming neither the rank nor the linears.
void check_adapter_bytes(const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& chosen,
                         int64_t rank) {
  long double bytes = 0;
  for (const auto& [name, module] : chosen) {
    const torch::Tensor& weight = module->as<torch::nn::LinearImpl>()->weight;
    if (weight.dim() == 2) bytes += 4.0L * rank * static_cast<long double>(weight.size(0) + weight.size(1));
  }
  const int64_t available = host_memory_available();
  TORCH_CHECK(bytes <= static_cast<long double>(available), "lora::apply: rank ", rank, " on ", chosen.size(),
              " linears makes ", static_cast<double>(bytes) / (1 << 20),
              " MiB of adapters (r x (in + out) fp32 elements a linear), beyond this host's ", format_mib(available),
              " available: expected a rank that fits (LoRA's are typically 4 to 64)");
}

}  // namespace

LoraReport apply(torch::nn::Module& model, const LoraOptions& options) {
  TORCH_CHECK(options.rank() >= 1, "lora::apply: the rank must be at least 1, got ", options.rank());
  TORCH_CHECK(options.alpha() > 0, "lora::apply: alpha must be positive, got ", options.alpha());
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() < 1, "lora::apply: dropout must be in [0, 1), got ",
              options.dropout());
  TORCH_CHECK(!options.targets().empty(), "lora::apply: no targets: expected linears' names such as q_proj");
  const bool all_linear = options.targets().size() == 1 && options.targets()[0] == "all-linear";

  // Which linears, decided before any is changed.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> chosen;
  std::set<std::string> matched;
  for (const auto& item : model.named_modules()) {
    const std::string& name = item.key();
    TORCH_CHECK(!ends_with(name, "." + kDown) && name != kDown, "lora::apply: the model has adapters already ('",
                name, "'): apply once");
    bool wanted = false;
    if (all_linear) {
      wanted = item.value()->as<torch::nn::LinearImpl>() && !matches(name, "lm_head");
    } else {
      for (const auto& target : options.targets()) {
        if (!matches(name, target)) continue;
        matched.insert(target);
        wanted = true;
      }
    }
    if (!wanted) continue;
    TORCH_CHECK(item.value()->as<torch::nn::LinearImpl>(), "lora::apply: '", name,
                "' is a target but not a torch::nn::Linear (it is a ", item.value()->name(),
                "): adapters go on linears only");
    chosen.emplace_back(name, item.value());
  }
  if (!all_linear) {
    for (const auto& target : options.targets()) {
      TORCH_CHECK(matched.count(target), "lora::apply: the target '", target,
                  "' names no module of the model (expected a module's name or its last part, such as q_proj; "
                  "or \"all-linear\")");
    }
  }
  TORCH_CHECK(!chosen.empty(), "lora::apply: \"all-linear\" found no torch::nn::Linear in the model");
  check_adapter_bytes(chosen, options.rank());

  for (auto& param : model.parameters()) param.requires_grad_(false);
  LoraReport report;
  for (auto& [name, module] : chosen) {
    auto* linear = module->as<torch::nn::LinearImpl>();
    torch::Tensor base = linear->weight;
    TORCH_CHECK(base.defined() && base.dim() == 2, "lora::apply: '", name, "' has no 2-D weight");
    auto down = std::make_shared<LoraDownImpl>(base, options.rank(), options.alpha(), options.dropout());
    linear->register_module(kDown, down);
    auto up = linear->register_module(
        kUp, torch::nn::Linear(torch::nn::LinearOptions(options.rank(), base.size(0)).bias(false)));
    up->weight.set_data(up->weight.to(base.options()));
    down->up_weight = up->weight;
    init_parameter(name + "." + kDown + ".weight", down->weight, options.seed());
    init_parameter(name + "." + kUp + ".weight", up->weight, options.seed());
    // A direct linear(x) would leave the adapter out: make it fail instead
    // (the registered parameter, which state dicts and fully_shard use, stays).
    linear->weight = torch::Tensor();
    report.adapted.push_back(name);
    report.trainable += down->weight.numel() + up->weight.numel();
  }
  for (const auto& [name, param] : unique_named_parameters(model)) report.parameters += param.numel();
  return report;
}

bool has_adapter(const torch::nn::Linear& linear) { return down_of(*linear.ptr()) != nullptr; }

torch::Tensor forward(const torch::nn::Linear& linear, const torch::Tensor& x) {
  const std::shared_ptr<torch::nn::LinearImpl>& module = linear.ptr();
  const LoraDownImpl* down = down_of(*module);
  if (!down) return module->forward(x);
  namespace F = torch::nn::functional;
  torch::Tensor result = F::linear(x, down->base_weight, module->bias);
  // A base held in another dtype than the adapters (fsdp-train --base-dtype
  // bf16): the adapters compute in theirs, and their update joins the
  // base's output in its dtype, as PEFT does. (No-ops where they agree.)
  torch::Tensor h = x.to(down->weight.scalar_type());
  if (down->dropout > 0) h = F::dropout(h, F::DropoutFuncOptions().p(down->dropout).training(module->is_training()));
  // PEFT's order: the base, then B(A(x)) scaled (peft/tuners/lora/layer.py).
  const torch::Tensor update =
      F::linear(F::linear(h, down->weight), down->up_weight) * (down->alpha / static_cast<double>(down->rank));
  return result + update.to(result.scalar_type());
}

std::vector<AdapterInfo> adapters(const torch::nn::Module& model) {
  std::vector<AdapterInfo> found;
  for (const auto& item : model.named_modules()) {
    const LoraDownImpl* down = item.value()->as<torch::nn::LinearImpl>() ? down_of(*item.value()) : nullptr;
    if (down) found.push_back(AdapterInfo{item.key(), down->rank, down->alpha, down->dropout});
  }
  return found;
}

}  // namespace fsdp::lora
