// The unit lifecycle: the state machine, the autograd hooks that drive it,
// and the end-of-backward callback that completes every gradient reduction.

#include "fsdp/fully_shard.h"

#include "fsdp/memory.h"
#include "fsdp/trace.h"
#include "base/device_context.h"
#include "core/fsdp_state_impl.h"
#include "core/gather_order.h"
#include "core/host_groups.h"
#include "core/unit.h"
#include "core/shard_offload.h"
#include "base/memory_counters.h"
#include "base/trace_events.h"
#include "core/unit_plan.h"
#include "core/strategy_rules.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

namespace fsdp {

using detail::FsdpStateImpl;

namespace {

std::mutex registry_mutex;
std::unordered_map<const torch::nn::Module*, Unit*>& registry() {
  static std::unordered_map<const torch::nn::Module*, Unit*> units;
  return units;
}

// Fires after autograd has accumulated one parameter's gradient.
struct GradientReadyHook final : torch::autograd::FunctionPostHook {
  explicit GradientReadyHook(Unit* unit) : unit(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    unit->on_gradient_ready();
    return outputs;
  }
  Unit* unit;
};

std::vector<compat::NodePtr> make_accumulators(const std::vector<FlatParamEntry>& entries) {
  std::vector<compat::NodePtr> accumulators;
  for (const auto& e : entries) {
    if (!e.param.requires_grad()) continue;  // frozen: no gradient to wait for
    TORCH_CHECK(e.param.is_leaf(), "parameter '", e.name, "' is not a leaf tensor and cannot be sharded");
    accumulators.push_back(torch::autograd::impl::grad_accumulator(e.param));
  }
  return accumulators;
}

// Splits each unit's plan into its buffers' plans: its trainable
// parameters, then, where it has any, its frozen ones (requires_grad false;
// see Unit::frozen_params()), then its NF4 weights (`nf4`, frozen_nf4).
// Returns each buffer plan's kind. A unit without frozen parameters has one
// buffer, so a model that trains every parameter is sharded, and trains,
// exactly as without this split.
std::vector<BufferKind> split_frozen_parameters(std::vector<UnitPlan>& plans,
                                                const std::set<const c10::TensorImpl*>& nf4) {
  std::vector<UnitPlan> split;
  std::vector<BufferKind> kinds;
  for (auto& plan : plans) {
    const std::string base = plan.name.empty() ? "<root>" : plan.name;
    UnitPlan frozen_part{base + "#frozen", plan.module, {}}, nf4_part{base + "#nf4", plan.module, {}};
    std::vector<std::pair<std::string, torch::Tensor>> trainable;
    for (auto& named : plan.params) {
      const bool quantized = nf4.count(named.second.unsafeGetTensorImpl()) > 0;
      (named.second.requires_grad() ? trainable : quantized ? nf4_part.params : frozen_part.params).push_back(named);
    }
    plan.params = std::move(trainable);
    split.push_back(std::move(plan));
    kinds.push_back(BufferKind::kTrainable);
    for (auto* part : {&frozen_part, &nf4_part}) {
      if (part->params.empty()) continue;
      kinds.push_back(part == &nf4_part ? BufferKind::kNf4 : BufferKind::kFrozen);
      split.push_back(std::move(*part));
    }
  }
  plans = std::move(split);
  return kinds;
}

// Each unit's shard over a shard group of `k` ranks, as its FlatParam will
// have it (for the offload's plan, before any unit is built).
std::vector<offload::ShardPlan> shard_plans(const std::vector<UnitPlan>& plans, const std::vector<BufferKind>& kinds,
                                            int64_t k) {
  std::vector<offload::ShardPlan> shards;
  for (size_t u = 0; u < plans.size(); ++u) {
    int64_t numel = 0;
    for (const auto& p : plans[u].params) numel += p.second.numel();
    shards.push_back({(numel + k - 1) / k, kinds[u] != BufferKind::kTrainable});
  }
  return shards;
}

// The host block cache's limit fully_shard sets (FullyShardOptions::
// cache_host_blocks): six of the largest buffer's fp32 copies, three with
// disk offload (a run sized against memory, where the cache's reserved
// bytes are counted: the trainer's preflight adds them). Without the cache,
// glibc keeps freed shard-sized buffers in its heap and RSS grows far past
// the live bytes (xl at W = 4 with offload: 5.9 GB a rank against 2.7 GB).
int64_t host_block_cache_limit(int64_t largest_padded_numel, bool nvme_offload) {
  return (nvme_offload ? 3 : 6) * largest_padded_numel * static_cast<int64_t>(sizeof(float));
}

}  // namespace

const char* unit_state_name(UnitState state) {
  switch (state) {
    case UnitState::kSharded: return "SHARDED";
    case UnitState::kUnsharded: return "UNSHARDED";
    case UnitState::kForward: return "FORWARD";
    case UnitState::kBackward: return "BACKWARD";
  }
  return "unknown";
}

Unit::Unit(FsdpStateImpl* owner, std::string name, torch::nn::Module* module)
    : owner_(owner), name_(std::move(name)), module_(module) {}

void Unit::adopt(std::unique_ptr<FlatParam> buffer) {
  if (buffer->frozen()) {
    std::unique_ptr<FlatParam>& slot = buffer->nf4() ? nf4_ : frozen_;
    TORCH_CHECK(!slot, "FSDP unit '", display_name(), "' was given a second ", buffer->nf4() ? "NF4" : "frozen",
                " buffer");
    buffer->initialize_views();
    slot = std::move(buffer);
    buffers_.push_back(slot.get());  // after the trainable one, which goes first whenever it comes
    return;
  }
  TORCH_CHECK(!flat_, "FSDP unit '", display_name(), "' was given a second trainable buffer");
  grad_accumulators_ = make_accumulators(buffer->entries());
  for (auto& accumulator : grad_accumulators_) accumulator->add_post_hook(std::make_unique<GradientReadyHook>(this));
  buffer->initialize_views();
  state_ = buffer->config().persistent_params ? UnitState::kUnsharded : UnitState::kSharded;
  flat_ = std::move(buffer);
  buffers_.insert(buffers_.begin(), flat_.get());
}

bool Unit::checkpointed() const {
  return owner_->options().activation_checkpointing() && this != &owner_->root_unit();
}

std::string Unit::display_name() const { return name_.empty() ? "<root>" : name_; }

void Unit::transition(std::initializer_list<UnitState> from, UnitState to) {
  bool legal = false;
  std::string expected;
  for (UnitState f : from) {
    legal = legal || state_ == f;
    expected += (expected.empty() ? "" : " or ") + std::string(unit_state_name(f));
  }
  TORCH_CHECK(legal, "FSDP unit '", display_name(), "': illegal transition to ", unit_state_name(to), " from ",
              unit_state_name(state_), " (expected ", expected,
              "). Is the unit's module called outside fsdp::unit_forward, or twice in one forward?");
  state_ = to;
}

void Unit::start_gathers() {
  for (FlatParam* buffer : buffers()) buffer->start_unshard();
}

void Unit::finish_gathers() {
  for (FlatParam* buffer : buffers()) buffer->unshard();
}

void Unit::reshard_all() {
  for (FlatParam* buffer : buffers()) buffer->reshard();
}

void Unit::pre_forward() {
  owner_->on_forward_entered(*this);
  inputs_watched_ = 0;
  transition({UnitState::kSharded, UnitState::kUnsharded}, UnitState::kForward);
  for (FlatParam* buffer : buffers()) buffer->drop_secondary();  // left by a forward whose backward never came
  span_begin_us_ = trace::enabled() ? trace::now_us() : -1.0;
  owner_->on_unit_started(*this);
  // Our own gather is issued first, the next unit's after it: every rank
  // issues the same sequence.
  start_gathers();
  if (owner_->options().forward_prefetch()) owner_->prefetch_after(*this, /*backward=*/false);
  finish_gathers();
}

void Unit::post_forward() {
  // Without autograd there is no backward to keep the parameters for; an
  // UnshardScope keeps them for its whole life.
  const bool reshard = !flat_->config().persistent_params && !owner_->in_unshard_scope() &&
                       (reshards_after_forward(owner_->options().strategy()) || !torch::GradMode::is_enabled());
  transition({UnitState::kForward}, reshard ? UnitState::kSharded : UnitState::kUnsharded);
  if (reshard && torch::GradMode::is_enabled() && owner_->options().zero_plus_plus().secondary_partition()) {
    for (FlatParam* buffer : buffers()) buffer->keep_secondary();  // backward gathers it inside the host
  }
  if (reshard) reshard_all();
  trace::complete("forward " + display_name(), "forward", span_begin_us_);
  if (this == &owner_->root_unit() && !torch::GradMode::is_enabled()) owner_->finish_forward_without_backward();
}

void Unit::pre_backward() {
  // A unit with several outputs hears this once per output; the first wins
  // (also when a late one arrives after the unit's gradients were reduced).
  TORCH_CHECK(!owner_->in_unshard_scope(), "FSDP unit '", display_name(),
              "': backward inside an fsdp::UnshardScope (the scope is for evaluation and generation; run "
              "backward outside it, or under torch::NoGradGuard inside it)");
  owner_->on_backward_event();
  if (state_ == UnitState::kBackward || backward_done_in_this_pass_) return;
  transition({UnitState::kSharded, UnitState::kUnsharded}, UnitState::kBackward);
  span_begin_us_ = trace::enabled() ? trace::now_us() : -1.0;
  owner_->on_unit_started(*this);
  start_gathers();
  if (owner_->options().backward_prefetch() == BackwardPrefetch::kPre) owner_->prefetch_after(*this, /*backward=*/true);
  finish_gathers();
  // A checkpointed unit recomputes its forward first: its gradient buffer
  // waits until then (before_recomputed_gradients).
  if (owner_->requires_gradient_sync() && !checkpointed()) flat_->prepare_gradient_buffer();
  gradients_pending_ = static_cast<int64_t>(grad_accumulators_.size()) + inputs_watched_;
}

void Unit::before_recomputed_gradients() {
  if (!owner_->requires_gradient_sync()) return;
  // The previous unit's reduction overlapped the recompute; finishing it
  // before this unit's gradient buffer exists keeps one full-size gradient
  // buffer alive instead of two.
  owner_->finish_reductions_in_flight(/*wait_for_host_copies=*/false);
  flat_->prepare_gradient_buffer();
}

void Unit::on_gradient_ready() {
  TORCH_CHECK(state_ == UnitState::kBackward, "FSDP unit '", display_name(),
              "': a parameter gradient arrived while the unit is ", unit_state_name(state_),
              "; its parameters were used outside the unit's forward");
  if (--gradients_pending_ == 0) post_backward();
}

void Unit::on_input_gradient() {
  // An input's gradient outside this unit's backward (its outputs got none,
  // or the end of backward already finished it): nothing waits for it.
  if (state_ != UnitState::kBackward) return;
  if (--gradients_pending_ == 0) post_backward();
}

void Unit::post_backward() {
  backward_done_in_this_pass_ = true;
  const bool persistent = flat_->config().persistent_params;
  transition({UnitState::kBackward}, persistent ? UnitState::kUnsharded : UnitState::kSharded);
  if (owner_->options().backward_prefetch() == BackwardPrefetch::kPost) owner_->prefetch_after(*this, /*backward=*/true);
  if (owner_->requires_gradient_sync()) {
    // A reduction in flight holds its input (full size) and its result
    // (full size for full gradients, a shard otherwise) until finished:
    // finish the previous units' (overlapped with this unit's backward)
    // before starting ours, so at most one is in flight.
    owner_->finish_reductions_in_flight(/*wait_for_host_copies=*/false);
    flat_->start_reduce_gradients();  // the trainable parameters' only: frozen ones have none
  }
  reshard_all();
  trace::complete("backward " + display_name(), "backward", span_begin_us_);
}

FsdpStateImpl::FsdpStateImpl(FsdpState& self, std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group,
                             FullyShardOptions options)
    : self_(self), module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {}

FsdpStateImpl::~FsdpStateImpl() = default;

void FsdpStateImpl::build(const offload::PlacementChoice& placements) {
  TORCH_CHECK(module_, "fully_shard: the module is null");
  TORCH_CHECK(group_, "fully_shard: the process group is null");
  std::vector<UnitPlan> plans = plan_units(*module_, options_.wrap_policy());
  const std::vector<BufferKind> kinds =
      split_frozen_parameters(plans, nf4_weights(*module_, options_.mixed_precision()));
  TORCH_CHECK(!options_.mixed_precision().frozen_nf4() ||
                  (!options_.offload().is_cpu() && !options_.offload().nvme_options() &&
                   !options_.zero_plus_plus().any()),
              "fully_shard: frozen_nf4 with an offload or ZeRO++ is not supported yet: the offloads and ZeRO++ ",
              "hold float32 shards, an NF4 base's are bytes; leave frozen_nf4 unset or the offload off");
  if (const auto dtype = options_.mixed_precision().frozen_param_dtype()) {
    TORCH_CHECK(*dtype == torch::kFloat || *dtype == torch::kBFloat16 || *dtype == torch::kHalf,
                "fully_shard: frozen_param_dtype must be float32, bfloat16 or float16, got ", *dtype);
    TORCH_CHECK(!options_.offload().is_cpu() && !options_.offload().nvme_options() &&
                    options_.zero_plus_plus().gather_quantization() == Quantization::kNone,
                "fully_shard: frozen_param_dtype with an offload or quantized gathers is not "
                "supported: the offloads and ZeRO++'s quantization hold float32 shards; leave it unset");
  }
  // Everything is checked before any parameter is touched: a refused model stays intact.
  // Where the units compute: the option, else the first parameter's device
  // (and then every other parameter must be there too).
  std::optional<c10::Device> device = options_.device();
  const bool move = device.has_value();
  for (const auto& plan : plans) {
    TORCH_CHECK(!find_unit(plan.module), "fully_shard: module '", plan.name.empty() ? "<root>" : plan.name,
                "' is already part of a sharded model");
    for (const auto& [name, param] : plan.params) {
      if (!device) device = param.device();
      TORCH_CHECK((move || param.device() == *device) && param.scalar_type() == torch::kFloat,
                  "fully_shard: parameter '", name, "' must be a float32 tensor on ", *device,
                  " (where the first parameter is; FullyShardOptions::device moves them), found ", param.scalar_type(),
                  " on ", param.device());
    }
  }
  device_ = device.value_or(c10::Device(torch::kCPU));
  placements.check(options_, device_);
  check_zero_plus_plus(options_);
  check_same_plan_on_every_rank(plans);
  make_groups();
  device_context_ = std::make_unique<DeviceContext>(device_, /*copy_stream=*/options_.offload().is_cpu());
  offload_ = placements.make(options_, *device_context_);
  // Offloaded shards cross on the copy stream, which waits for the compute
  // stream: their gathers keep that order.
  const std::optional<c10::Stream> gather_stream = shard_group_ ? shard_group_->gather_stream() : std::nullopt;
  // ZeRO++'s gathers use buffers of their own (packed payloads, host
  // slices) whose lifetimes the gather order does not manage: they wait for
  // the compute stream.
  // So do an NF4 base's (its packed records).
  if (gather_stream && !options_.offload().is_cpu() && !options_.offload().nvme_options() &&
      !options_.zero_plus_plus().any() && !options_.mixed_precision().frozen_nf4()) {
    gather_order_ = std::make_unique<GatherOrder>(*gather_stream, device_);
  }
  const ShardingStrategy strategy = options_.strategy();
  FlatParamConfig config{shard_group_,      replicate_group_, keeps_params_unsharded(strategy),
                         keeps_full_gradients(strategy), options_.mixed_precision(), device_,
                         offload_.get(),    gather_order_.get()};
  config.zero_plus_plus = options_.zero_plus_plus();
  config.host_group = host_group_;
  config.cross_host_group = cross_host_group_;
  config.host_major_ranks = host_major_ranks_;
  offload_->prepare(self_, shard_plans(plans, kinds, shard_group_ ? shard_group_->size() : 1));
  build_units(std::move(plans), kinds, config);
  if (options_.cache_host_blocks() && device_context_->on_host() && memory::counting_allocator_installed()) {
    int64_t largest = 0;
    for (const FlatParam* flat : flat_params_) largest = std::max(largest, flat->padded_numel());
    const int64_t limit = host_block_cache_limit(largest, options_.offload().nvme_options().has_value());
    memory::set_block_cache_limit(std::max(memory::block_cache_limit(), limit));
  }
  const torch::ScalarType buffer_dtype = options_.mixed_precision().param_dtype();
  for (auto& buffer : module_->buffers()) {
    const c10::Device to = move ? *device : buffer.device();
    buffer.set_data(buffer.is_floating_point() ? buffer.to(to, buffer_dtype) : buffer.to(to));
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const auto& unit : units_) registry()[unit->module()] = unit.get();
}

void FsdpStateImpl::set_unsharded_scope(bool on, bool writeback) {
  if (on) {
    self_.check_idle();
    TORCH_CHECK(!unshard_scope_, "fsdp::UnshardScope: the model is already inside one");
    TORCH_CHECK(!writeback || options_.mixed_precision().param_dtype() == torch::kFloat,
                "fsdp::UnshardScope: writeback needs float32 parameters; the parameters are gathered in ",
                options_.mixed_precision().param_dtype());
    for (auto& unit : units_) {
      for (FlatParam* flat : unit->buffers()) flat->unshard(/*exact=*/true);  // every rank gathers every unit, in the same order
      unit->state_ = UnitState::kUnsharded;
    }
    unshard_scope_ = true;
    return;
  }
  unshard_scope_ = false;
  for (auto& unit : units_) {
    TORCH_CHECK(unit->state_ == UnitState::kUnsharded, "FSDP unit '", unit->display_name(), "' is ",
                unit_state_name(unit->state_), " when its UnshardScope ends (expected UNSHARDED)");
    for (FlatParam* flat : unit->buffers()) {
      if (!writeback) continue;
      ResidentScope resident(self_, *flat);
      flat->write_back_shard();
    }
    if (unit->flat_param().config().persistent_params) continue;
    unit->reshard_all();
    unit->state_ = UnitState::kSharded;
  }
}

UnshardScope::UnshardScope(FsdpState& state, bool writeback) : state_(state), writeback_(writeback) {
  FsdpStateImpl::of(state_).set_unsharded_scope(true, writeback_);
}

UnshardScope::~UnshardScope() {
  try {
    FsdpStateImpl::of(state_).set_unsharded_scope(false, writeback_);
  } catch (const std::exception& e) {
    std::cerr << "fsdp: leaving an UnshardScope failed: " << e.what() << "\n";
  }
}

void FsdpStateImpl::build_units(std::vector<UnitPlan> buffers, const std::vector<BufferKind>& kinds,
                                const FlatParamConfig& config) {
  // The units first, empty: a buffer goes to the unit of the last
  // trainable plan before it (its own).
  std::vector<Unit*> unit_of(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (kinds[b] == BufferKind::kTrainable) units_.push_back(std::make_unique<Unit>(this, buffers[b].name, buffers[b].module));
    TORCH_CHECK(!units_.empty(), "fully_shard: a frozen buffer has no unit before it");
    unit_of[b] = units_.back().get();
  }
  const ParamInitFn& init = options_.param_init_fn();
  auto build = [&](size_t b) { make_buffer(*unit_of[b], std::move(buffers[b]), config, b, kinds[b]); };
  if (!init) {
    for (const auto& plan : buffers) {
      for (const auto& [name, param] : plan.params) {
        TORCH_CHECK(!memory::is_deferred(param.data_ptr()), "fully_shard: parameter '", name,
                    "' was created under memory::DeferredInit and has no values: give FullyShardOptions::param_init_fn");
      }
    }
    for (size_t b = 0; b < buffers.size(); ++b) build(b);
  } else {
    // Sharded initialization: parameters in named_parameters() order, each
    // buffer sharded (and its full parameters freed) once its last one is done.
    std::unordered_map<const c10::TensorImpl*, size_t> owner;
    std::vector<size_t> remaining(buffers.size());
    for (size_t b = 0; b < buffers.size(); ++b) {
      for (const auto& [name, param] : buffers[b].params) owner[param.unsafeGetTensorImpl()] = b;
      remaining[b] = buffers[b].params.size();
    }
    std::vector<bool> built(buffers.size(), false);
    auto build_once = [&](size_t b) {
      build(b);
      built[b] = true;
    };
    for (size_t b = 0; b < buffers.size(); ++b)
      if (remaining[b] == 0) build_once(b);  // a buffer without parameters (a unit with none of its own)
    for (auto& [name, param] : unique_named_parameters(*module_)) {
      auto it = owner.find(param.unsafeGetTensorImpl());
      if (it == owner.end()) continue;  // not sharded
      const std::vector<int64_t> shape = param.sizes().vec();
      {
        torch::NoGradGuard no_grad;
        // On the CPU, whatever the units' device: the init draws from the CPU
        // generator, so the weights are those of an unsharded CPU build. The
        // unit moves to its device when it is sharded, a buffer at a time.
        if (memory::is_deferred(param.data_ptr())) param.set_data(torch::empty(shape, torch::kFloat));
        init(name, param);
      }
      TORCH_CHECK(param.sizes().vec() == shape && param.scalar_type() == torch::kFloat &&
                      !memory::is_deferred(param.data_ptr()),
                  "fully_shard: param_init_fn left parameter '", name, "' without float32 values of its shape");
      if (--remaining[it->second] == 0) build_once(it->second);
    }
    for (size_t b = 0; b < buffers.size(); ++b) {
      TORCH_CHECK(built[b], "fully_shard: unit '", unit_of[b]->display_name(),
                  "' has parameters that named_parameters() does not list");
    }
  }
  for (const auto& unit : units_)
    for (FlatParam* flat : unit->buffers()) flat_params_.push_back(flat);
}

void FsdpStateImpl::make_buffer(Unit& unit, UnitPlan plan, const FlatParamConfig& config, size_t index,
                                BufferKind kind) {
  FlatParamConfig own = config;
  own.index = index;
  own.name = std::move(plan.name);
  own.frozen = kind != BufferKind::kTrainable;
  own.nf4 = kind == BufferKind::kNf4;
  const torch::ScalarType compute = options_.mixed_precision().effective_frozen_param_dtype();
  if (own.nf4) {  // held as NF4 records, dequantized into the frozen compute dtype
    own.mixed_precision = MixedPrecision().param_dtype(compute).reduce_dtype(compute);
  } else if (own.frozen && options_.mixed_precision().frozen_param_dtype()) {  // held, gathered and computed in its own dtype
    own.shard_dtype = *options_.mixed_precision().frozen_param_dtype();
    own.mixed_precision = MixedPrecision().param_dtype(own.shard_dtype).reduce_dtype(own.shard_dtype);
  }
  auto flat = std::make_unique<FlatParam>(std::move(plan.params), std::move(own));
  FlatParam& built = *flat;
  unit.adopt(std::move(flat));
  offload_->unit_built(built);
}

void FsdpStateImpl::check_same_plan_on_every_rank(const std::vector<UnitPlan>& plans) const {
  // A fingerprint of the plan: unit count, total elements, and a hash over
  // the units' names and sizes, in order.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&hash](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  };
  int64_t total = 0;
  const int64_t settings[] = {static_cast<int64_t>(options_.strategy()), options_.ranks_per_node(),
                              static_cast<int64_t>(options_.mixed_precision().param_dtype()),
                              static_cast<int64_t>(options_.mixed_precision().effective_reduce_dtype()),
                              static_cast<int64_t>(options_.zero_plus_plus().gather_quantization()),
                              static_cast<int64_t>(options_.zero_plus_plus().secondary_partition()),
                              static_cast<int64_t>(options_.zero_plus_plus().gradient_quantization()),
                              options_.zero_plus_plus().quantization_block(),
                              static_cast<int64_t>(options_.mixed_precision().frozen_nf4())};
  mix(settings, sizeof(settings));
  for (const auto& plan : plans) {
    int64_t numel = 0;
    for (const auto& p : plan.params) numel += p.second.numel();
    mix(plan.name.data(), plan.name.size());
    mix(&numel, sizeof(numel));
    total += numel;
  }
  const int world = group_->size();
  torch::Tensor mine = torch::tensor({static_cast<int64_t>(plans.size()), total, static_cast<int64_t>(hash)}, torch::kLong);
  torch::Tensor all = torch::empty({3 * world}, torch::kLong);
  group_->all_gather(all, mine)->wait();
  auto* a = all.data_ptr<int64_t>();
  bool same = true;
  for (int r = 1; r < world; ++r) same = same && a[3 * r] == a[0] && a[3 * r + 1] == a[1] && a[3 * r + 2] == a[2];
  if (same) return;
  std::ostringstream msg;
  msg << "fully_shard: the ranks sharded different models, or with different options (wrap policy, model "
         "configuration, parameter set, strategy, precision); units and parameter elements per rank:";
  for (int r = 0; r < world; ++r) msg << "\n  rank " << r << ": " << a[3 * r] << " units, " << a[3 * r + 1] << " elements";
  TORCH_CHECK(false, msg.str());
}

FsdpState::~FsdpState() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (auto& unit : impl_->units_) registry().erase(unit->module());
}

std::optional<offload::NvmeOffloadInfo> FsdpState::nvme_offload() const { return impl_->offload_->nvme_info(); }

std::vector<torch::Tensor> FsdpState::parameters() const {
  std::vector<torch::Tensor> shards;
  for (const auto& unit : impl_->units_) shards.push_back(unit->flat_param().shard());
  return shards;
}

size_t FsdpState::num_units() const { return impl_->units_.size(); }
bool FsdpState::gathers_run_ahead() const { return impl_->gather_order_ != nullptr; }
const ProcessGroupPtr& FsdpState::group() const { return impl_->group_; }
const FullyShardOptions& FsdpState::options() const { return impl_->options_; }
c10::Device FsdpState::device() const { return impl_->device_; }
torch::nn::Module& FsdpState::module() const { return *impl_->module_; }
const ProcessGroupPtr& FsdpState::shard_group() const { return impl_->shard_group_; }
const ProcessGroupPtr& FsdpState::replicate_group() const { return impl_->replicate_group_; }
const ProcessGroupPtr& FsdpState::host_group() const { return impl_->host_group_; }
const ProcessGroupPtr& FsdpState::cross_host_group() const { return impl_->cross_host_group_; }
void FsdpState::set_requires_gradient_sync(bool sync) { impl_->requires_gradient_sync_ = sync; }
bool FsdpState::requires_gradient_sync() const { return impl_->requires_gradient_sync_; }
int FsdpState::max_prefetched_unused() const { return impl_->max_prefetched_unused_; }
void FsdpState::reset_prefetch_stats() { impl_->max_prefetched_unused_ = 0; }

void FsdpStateImpl::make_groups() {
  const ShardingStrategy strategy = options_.strategy();
  const int world = group_->size(), rank = group_->rank();
  if (strategy == ShardingStrategy::kNoShard) {
    replicate_group_ = group_->split(0, rank);
    hosts_ = count_hosts(group_, options_.ranks_per_node());
    return;
  }
  if (!is_hybrid(strategy)) {
    shard_group_ = group_->split(0, rank);
    if (!options_.zero_plus_plus().any()) {
      hosts_ = count_hosts(group_, options_.ranks_per_node());
      return;
    }
    HostGroups hosts = make_host_groups(group_, options_.ranks_per_node(), device_);
    host_group_ = std::move(hosts.host);
    cross_host_group_ = std::move(hosts.cross_host);
    host_major_ranks_ = std::move(hosts.host_major_ranks);
    hosts_ = hosts.hosts;
    return;
  }
  const int per_node = options_.ranks_per_node();
  if (per_node > 0) {
    TORCH_CHECK(world % per_node == 0, "fully_shard: ", world, " ranks cannot form nodes of ", per_node,
                " ranks (ranks_per_node must divide the world size)");
    shard_group_ = group_->split(rank / per_node, rank);
  } else {
    shard_group_ = group_->split_shared_memory();
    torch::Tensor sizes = torch::empty({world}, torch::kLong);
    group_->all_gather(sizes, torch::tensor({static_cast<int64_t>(shard_group_->size())}, torch::kLong))->wait();
    TORCH_CHECK(sizes.min().item<int64_t>() == sizes.max().item<int64_t>(), "fully_shard: hybrid sharding needs ",
                "the same number of ranks on every node; MPI reports node sizes from ", sizes.min().item<int64_t>(),
                " to ", sizes.max().item<int64_t>());
  }
  replicate_group_ = group_->split(shard_group_->rank(), rank);
  hosts_ = world / shard_group_->size();
}

namespace {
void add_stats(CommStats& total, const ProcessGroupPtr& group) {
  if (!group) return;
  const CommStats s = group->stats();
  for (size_t k = 0; k < total.bytes.size(); ++k) {
    total.bytes[k] += s.bytes[k];
    total.calls[k] += s.calls[k];
  }
  total.wait_seconds += s.wait_seconds;
}
}  // namespace

CommStats FsdpState::cross_host_comm_stats() const {
  const FsdpStateImpl& impl = *impl_;
  CommStats total;
  if (impl.hosts_ <= 1) return total;
  // The shard group spans hosts unless the strategy is hybrid (then the
  // replicate group does); the cross-host group always does.
  add_stats(total, is_hybrid(impl.options_.strategy()) ? impl.replicate_group_ : impl.shard_group_);
  if (impl.options_.strategy() == ShardingStrategy::kNoShard) add_stats(total, impl.replicate_group_);
  add_stats(total, impl.cross_host_group_);
  return total;
}

CommStats FsdpState::comm_stats() const {
  const FsdpStateImpl& impl = *impl_;
  CommStats total;
  for (const auto* g : {&impl.shard_group_, &impl.replicate_group_, &impl.host_group_, &impl.cross_host_group_})
    add_stats(total, *g);
  return total;
}

void FsdpState::reset_comm_stats() {
  const FsdpStateImpl& impl = *impl_;
  for (const auto* g : {&impl.shard_group_, &impl.replicate_group_, &impl.host_group_, &impl.cross_host_group_})
    if (*g) (*g)->reset_stats();
}

void FsdpState::check_idle() const {
  for (const auto& unit : impl_->units_) {
    const bool persistent = unit->flat_param().config().persistent_params;
    const UnitState idle = persistent ? UnitState::kUnsharded : UnitState::kSharded;
    bool at_rest = unit->state() == idle;
    for (const FlatParam* flat : unit->buffers()) at_rest = at_rest && flat->is_unsharded() == persistent;
    TORCH_CHECK(at_rest, "FSDP unit '",
                unit->display_name(), "' is ", unit_state_name(unit->state()), " between steps (expected ",
                unit_state_name(idle), ")");
    TORCH_CHECK(!unit->flat_param().reduce_pending(), "FSDP unit '", unit->display_name(),
                "' still has a gradient reduction in flight between steps");
  }
  // A forward whose backward never came (autograd on, the loss dropped)
  // leaves its pass open, and in a pass gathers do not wait for the compute
  // stream. Every caller between steps (state dicts, checkpoints, an
  // UnshardScope, evaluation, TrainStep's end) comes through here before it
  // gathers or writes shards on the compute stream: closing the pass makes
  // those gathers wait for it again, and a backward after them begins a new
  // pass (on_backward_event). Review of issue 25, "a pass left open".
  if (impl_->gather_order_) impl_->gather_order_->end_pass();
}

void FsdpStateImpl::on_forward_entered(Unit& unit) {
  // The root's forward encloses every other unit's: it starts a new pass.
  if (&unit == units_.front().get()) {
    if (backward_callback_queued_) recover_from_failed_backward();
    release_unused_prefetches();
    if (gather_order_) {  // a forward whose backward never came ends here
      gather_order_->end_pass();
      gather_order_->begin_pass();
    }
    for (auto& u : units_) u->entered_in_this_forward_ = false;
    if (!forward_order_this_pass_.empty()) forward_order_ = std::move(forward_order_this_pass_);
    forward_order_this_pass_.clear();
  }
  if (!unit.entered_in_this_forward_) forward_order_this_pass_.push_back(&unit);
  unit.entered_in_this_forward_ = true;
}

void FsdpStateImpl::prefetch_after(const Unit& unit, bool backward) {
  // Backward runs the units in reverse: the root first, then the last
  // unit to enter forward, and so on.
  auto at = std::find(forward_order_.begin(), forward_order_.end(), &unit);
  if (at == forward_order_.end()) return;  // no whole pass seen yet, or the unit did not run in it
  const int64_t index = at - forward_order_.begin(), n = static_cast<int64_t>(forward_order_.size());
  for (int64_t d = 1; d <= options_.prefetch_depth(); ++d) {
    int64_t next = -1;
    if (!backward) {
      next = index + d;
    } else {
      next = (index == 0 ? n : index) - d;  // from the root: the last unit, backwards
      if (next <= 0) next = -1;              // the root itself is never prefetched
    }
    if (next < 0 || next >= n) break;
    issue_prefetch(forward_order_[next], backward);
  }
}

void FsdpStateImpl::issue_prefetch(Unit* unit, bool backward) {
  const bool already_ran = backward ? (unit->state_ == UnitState::kBackward || unit->backward_done_in_this_pass_)
                                    : unit->entered_in_this_forward_;
  const FlatParam& flat = unit->flat_param();
  if (already_ran || unit->prefetched_ || flat.config().persistent_params || flat.is_unsharded() ||
      flat.unshard_pending()) {
    return;
  }
  if (options_.limit_all_gathers() && prefetched_unused_ >= 1) {
    for (const auto& [u, b] : deferred_prefetches_)
      if (u == unit) return;
    deferred_prefetches_.emplace_back(unit, backward);
    return;
  }
  unit->start_gathers();
  unit->prefetched_ = true;
  max_prefetched_unused_ = std::max(max_prefetched_unused_, ++prefetched_unused_);
}

void FsdpStateImpl::on_unit_started(Unit& unit) {
  if (!unit.prefetched_) return;
  unit.prefetched_ = false;
  --prefetched_unused_;
  issue_deferred_prefetches();
}

void FsdpStateImpl::issue_deferred_prefetches() {
  auto pending = std::move(deferred_prefetches_);
  deferred_prefetches_.clear();
  for (const auto& [unit, backward] : pending) issue_prefetch(unit, backward);
}

void FsdpStateImpl::finish_forward_without_backward() {
  release_unused_prefetches();
  if (gather_order_) gather_order_->end_pass();
}

void FsdpStateImpl::release_unused_prefetches() {
  deferred_prefetches_.clear();
  for (auto& unit : units_) {
    if (!unit->prefetched_) continue;
    unit->prefetched_ = false;
    unit->finish_gathers();  // waits for the gathers every rank issued
    unit->reshard_all();
  }
  prefetched_unused_ = 0;
}

void FsdpStateImpl::recover_from_failed_backward() {
  // A backward that threw never ran its end-of-backward callback: finish
  // the reductions it started (every rank started the same ones), drop the
  // gradients it left, and return every unit to rest.
  backward_callback_queued_ = false;
  release_unused_prefetches();
  finish_reductions_in_flight();
  for (auto& unit : units_) {
    if (unit->state() != UnitState::kBackward) continue;
    unit->flat_param().drop_gradient_buffer();
    for (FlatParam* flat : unit->buffers()) flat->drop_secondary();
    for (const auto& e : unit->flat_param().entries()) e.param.mutable_grad().reset();
    unit->reshard_all();
    unit->state_ = unit->flat_param().config().persistent_params ? UnitState::kUnsharded : UnitState::kSharded;
  }
  if (gather_order_) gather_order_->end_pass();
}

void FsdpStateImpl::rethrow_forward_error(const c10::Error& error) const {
  std::string never_entered;
  for (const auto& unit : units_) {
    if (unit->entered_in_this_forward_) continue;
    never_entered += (never_entered.empty() ? "" : ", ") + unit->display_name();
  }
  if (never_entered.empty()) throw;  // the error being handled, with its own type
  TORCH_CHECK(false, error.what_without_backtrace(),
              "\n[fsdp] units not entered through fsdp::unit_forward before this error: ", never_entered,
              ". A unit's parameters hold no data outside its unit_forward; calling its module directly fails.");
}

void FsdpStateImpl::on_backward_event() {
  if (backward_callback_queued_) return;
  // Before anything of this backward changes: where the state leaves
  // memory, only TrainStep's step brings each unit's in around its update.
  TORCH_CHECK(in_train_step_ || offload_->keeps_state_in_memory(), "fsdp: a model with disk offload (OffloadPolicy::nvme) trains through ",
              "fsdp::TrainStep (with an fsdp::FusedAdamW): its optimizer step brings each unit's offloaded state from ",
              "disk into memory around that unit's update, which a plain loss.backward(); optimizer.step() cannot. ",
              "This backward was refused before it changed anything");
  if (gather_order_ && !gather_order_->in_pass()) gather_order_->begin_pass();
  backward_callback_queued_ = true;  // the first event of a new backward pass
  for (auto& unit : units_) unit->backward_done_in_this_pass_ = false;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void FsdpStateImpl::finish_reductions_in_flight(bool wait_for_host_copies) {
  // Copies to the host (offload on a GPU) are left in flight until the end
  // of backward, where the host waits for them once (the offload returns
  // their device blocks without a host wait before that).
  for (auto& unit : units_) {
    FlatParam& flat = unit->flat_param();
    if (!flat.collective_reduce_pending()) continue;
    // A quantized reduction's first step (the full-size gradient, inside
    // the host) is finished; its all-to-all across hosts, a quarter of a
    // shard per host, stays in flight behind the next unit's backward.
    if (!wait_for_host_copies && flat.reduce_in_first_stage()) {
      flat.advance_reduce();
    } else {
      flat.finish_reduce_gradients();
    }
  }
  if (!wait_for_host_copies) return;
  for (auto& unit : units_) {
    if (unit->flat_param().host_gradient_pending()) unit->flat_param().finish_host_gradient();
  }
}

void FsdpStateImpl::finish_backward() {
  backward_callback_queued_ = false;
  // Units some of whose parameters got no gradient in this pass never
  // counted down to zero: reduce them now (missing gradients count as zero).
  for (auto& unit : units_) {
    if (unit->state() == UnitState::kBackward) unit->post_backward();
  }
  finish_reductions_in_flight();
  release_unused_prefetches();
  for (FlatParam* flat : flat_params_) flat->drop_secondary();  // of units backward never reached
  if (gather_order_) gather_order_->end_pass();
  offload_->finish_backward();
}

namespace detail {

void rethrow_forward_error(const FsdpState& state, const c10::Error& error) {
  FsdpStateImpl::of(state).rethrow_forward_error(error);
}

namespace {

// The checkpointed forward of one unit: forward keeps only the input (and
// the CPU RNG state, and the GPU's for an input on one); backward, entered after the unit's pre-backward hook
// has gathered its parameters, reruns the unit's body with autograd on and
// backpropagates through it, which accumulates the parameters' gradients
// (firing the unit's post-backward) and returns the input's.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `anchor` requires grad, so the output does even when the input does not
  // (a first layer fed data): the unit's parameters still get gradients.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& /*anchor*/, int64_t unit_address) {
    Unit* unit = reinterpret_cast<Unit*>(unit_address);
    ctx->save_for_backward({input});
    ctx->saved_data["unit"] = unit_address;
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    if (!in_host_memory(input)) {
      ctx->saved_data["device_rng"] = at::globalContext().defaultGenerator(input.device()).get_state();
    }
    return unit->checkpoint_body()(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    Unit* unit = reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt());
    const torch::Tensor saved = ctx->get_saved_variables()[0];
    torch::Tensor input = saved.detach().requires_grad_(saved.requires_grad());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_now = generator.get_state();
    generator.set_state(ctx->saved_data["rng"].toTensor());
    // Dropout on a GPU draws from the device's generator: the recomputation
    // must draw what forward drew there too.
    std::optional<at::Generator> device_generator;
    at::Tensor device_rng_now;
    if (!in_host_memory(input)) {
      device_generator = at::globalContext().defaultGenerator(input.device());
      device_rng_now = device_generator->get_state();
      device_generator->set_state(ctx->saved_data["device_rng"].toTensor());
    }
    torch::Tensor output;
    {
      torch::AutoGradMode grad_on(true);
      trace::Span span("recompute " + unit->display_name(), "backward");
      output = unit->checkpoint_body()(input);
    }
    generator.set_state(rng_now);
    if (device_generator) device_generator->set_state(device_rng_now);
    unit->before_recomputed_gradients();
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool UnitForwardScope::checkpointed() const {
  return unit_ && unit_->checkpointed() && torch::GradMode::is_enabled();
}

torch::Tensor UnitForwardScope::run_checkpointed(std::function<torch::Tensor(const torch::Tensor&)> body,
                                                 const torch::Tensor& input) const {
  static const torch::Tensor anchor = torch::empty({0}).requires_grad_();
  unit_->checkpoint_body() = std::move(body);
  return CheckpointFunction::apply(input, anchor, reinterpret_cast<int64_t>(unit_));
}

void UnitForwardScope::refuse_checkpointing() const {
  TORCH_CHECK(false, "activation checkpointing: unit '", unit_->display_name(),
              "' must take exactly one tensor and return one tensor to be checkpointed");
}

UnitForwardScope::UnitForwardScope(const torch::nn::Module* module) : unit_(find_unit(module)) {
  if (unit_) unit_->pre_forward();
}

UnitForwardScope::~UnitForwardScope() {
  if (!unit_ || unit_->state() != UnitState::kForward) return;
  try {
    unit_->post_forward();
  } catch (const std::exception& e) {
    std::cerr << "fsdp: resharding unit '" << unit_->display_name() << "' failed: " << e.what() << "\n";
  }
}

// The identity on a unit's input, whose backward tells the unit that the
// gradient of that input is done: the last node of the unit's backward for it.
struct InputGradientFunction : torch::autograd::Function<InputGradientFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               int64_t unit_address) {
    ctx->saved_data["unit"] = unit_address;
    return input.view_as(input);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt())->on_input_gradient();
    return {grad_outputs[0], torch::Tensor()};
  }
};

torch::Tensor UnitForwardScope::watch_input(const torch::Tensor& input) const {
  if (!unit_ || !input.defined() || !input.requires_grad() || !torch::GradMode::is_enabled()) return input;
  unit_->count_input();
  return InputGradientFunction::apply(input, reinterpret_cast<int64_t>(unit_));
}

void UnitForwardScope::watch_output(const torch::Tensor& output) const {
  if (!unit_ || !output.defined() || !output.requires_grad()) return;
  Unit* unit = unit_;
  output.register_hook([unit](const torch::Tensor&) { unit->pre_backward(); });
}

}  // namespace detail

Unit* find_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(module);
  return it == registry().end() ? nullptr : it->second;
}

}  // namespace fsdp
