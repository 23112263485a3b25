// Disk offload of a sharded model's state: which tensors go to disk, when
// they come back, and the pipelined optimizer step (see nvme_offload.h).

#include "offload/nvme_offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <algorithm>
#include <unordered_map>
#include <utility>

#include "core/fsdp_state_impl.h"
#include "core/unit.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "base/device_context.h"
#include "fsdp/memory.h"
#include "fsdp/options.h"
#include "fsdp/trace.h"
#include "core/scratch_file.h"
#include "base/trace_events.h"
#include "core/strategy_rules.h"
#include "core/loss_scaling.h"

namespace fsdp::offload {
namespace {

// Disk offload's faults, if the environment says
// FSDP_TEST_OFFLOAD_FAULT=<rank>:<step>:<kind> and this is that rank's
// <step>-th optimizer step through the offload (1-based):
//   kill      SIGKILL in the middle of the step (`mid_step`: after its first
//             unit's writes were queued, its reads still to come)
//   corrupt   at the step's end, one byte of the scratch file's first block
//             changed (the next read of that block fails its checksum)
//   truncate  at the step's end, the scratch file cut to half its size
// Does nothing otherwise.
void maybe_fault_offload_for_test(int rank, int64_t step, const std::string& scratch_path, bool mid_step) {
  static const char* spec = std::getenv("FSDP_TEST_OFFLOAD_FAULT");
  if (!spec) return;
  int victim = -1;
  long long nth = -1;
  char kind[16] = {0};
  if (std::sscanf(spec, "%d:%lld:%15s", &victim, &nth, kind) != 3 || victim != rank || nth != step) return;
  const std::string what = kind;
  if (what == "kill" && mid_step) std::raise(SIGKILL);
  if (mid_step) return;
  if (what == "corrupt") {
    const int fd = ::open(scratch_path.c_str(), O_RDWR);
    unsigned char byte = 0;
    if (fd >= 0 && ::pread(fd, &byte, 1, 100) == 1) {
      byte ^= 0xff;
      if (::pwrite(fd, &byte, 1, 100) != 1) std::perror("fault injection: pwrite");
    }
    if (fd >= 0) ::close(fd);
  } else if (what == "truncate") {
    const int fd = ::open(scratch_path.c_str(), O_RDWR);
    const off_t size = fd >= 0 ? ::lseek(fd, 0, SEEK_END) : 0;
    if (fd >= 0 && ::ftruncate(fd, size / 2) != 0) std::perror("fault injection: ftruncate");
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace

using memory::Category;
using memory::MemoryCategoryScope;

struct NvmeOffload::UnitSlots : UnitOffloadState {
  int64_t numel = 0;    // the shard's elements
  bool frozen = false;  // a frozen part: never stepped, so its state is never read for a step
  // Slots in the store; -1 where the tensor is not offloaded.
  int master = -1, compute = -1, exp_avg = -1, exp_avg_sq = -1, grad = -1;
  // Whether the slot holds the tensor's current value.
  bool master_on_disk = false, compute_on_disk = false, moments_on_disk = false;
  // The param-dtype copy kept in memory for the all-gathers when the master
  // is offloaded and the parameters are not.
  torch::Tensor compute_copy;
  // A param-dtype copy being written (kept alive until its write ends).
  torch::Tensor compute_out;
  // Versions when brought in by a ResidentScope: what changed is written back.
  int64_t master_version = -1, exp_avg_version = -1, exp_avg_sq_version = -1;
  // Step in backward: the unit stepped in this backward; its state's reads,
  // issued at its gather (read_state) and not yet waited for.
  bool stepped_in_backward = false;
  std::optional<Futures> state_reads;
  // Deferred step: the gradient prepared and written out in the last
  // backward, not yet taken by a step; the update left pending by step(),
  // and the gradient read back for it.
  std::shared_ptr<DeferredStep> pending;
  double clip_coefficient = 1.0;  // its gradient's, for the pending update (PreparedGradient's)
  torch::Tensor grad_in;
};

// One step() whose updates wait for their units' next gathers: what each
// update needs as it was when the step was taken (the trainer may change
// the learning rate before then).
struct NvmeOffload::DeferredStep {
  std::shared_ptr<const UnitStepper> stepper;  // UnitStepper::for_later: the group options copied
  int64_t number = 0;    // the optimizer step this is (1 first)
  bool started = false;  // a unit has stepped
};

NvmeOffload::UnitSlots& NvmeOffload::slots_of(const FlatParam& flat) {
  TORCH_CHECK(flat.offload_state(), "fsdp: unit ", flat.index(), " has no disk offload state (unit_built() makes it)");
  return static_cast<UnitSlots&>(*flat.offload_state());
}

NvmeOffload::UnitSlots& NvmeOffload::unit_slots(size_t unit) const {
  return slots_of(*flats_[unit]);
}

size_t NvmeOffload::num_units() const { return flats_.size(); }

struct NvmeOffload::Moments {
  torch::Tensor exp_avg, exp_avg_sq;  // the optimizer's own tensors
};

namespace {

using Clock = std::chrono::steady_clock;

bool in_memory(const torch::Tensor& t, int64_t numel) { return t.defined() && t.numel() == numel && numel > 0; }

torch::Tensor fresh(int64_t numel, torch::ScalarType dtype, Category category) {
  MemoryCategoryScope scope(category);
  return torch::empty({numel}, torch::TensorOptions().dtype(dtype));
}

}  // namespace

void check_nvme_offload_options(const FullyShardOptions& fsdp, c10::Device device) {
  if (!fsdp.offload().nvme_options()) return;
  const NvmeOffloadOptions& options = *fsdp.offload().nvme_options();
  const torch::ScalarType param_dtype = fsdp.mixed_precision().param_dtype();
  TORCH_CHECK(options.optimizer_state() || options.params(), "fully_shard: OffloadPolicy::nvme offloads nothing: set ",
              "optimizer_state(true), params(true) or both");
  TORCH_CHECK(is_host_device(device), "fully_shard: OffloadPolicy::nvme needs the units on the CPU, found ", device,
              " (on a GPU, OffloadPolicy::cpu() moves the state to host memory)");
  TORCH_CHECK(!options.params() || !keeps_params_unsharded(fsdp.strategy()), "fully_shard: NvmeOffloadOptions::params ",
              "needs a sharded strategy (full_shard, shard_grad_op, hybrid_shard or hybrid_shard_zero2); ",
              fsdp::enum_name(fsdp.strategy()), " keeps whole parameters in memory on every rank");
  const bool fp32 = param_dtype == torch::kFloat;
  TORCH_CHECK(fp32 || !options.params() || options.optimizer_state(), "fully_shard: NvmeOffloadOptions::params with ",
              fsdp::enum_name(param_dtype), " parameters needs optimizer_state(true) too: the ", fsdp::enum_name(param_dtype),
              " shard is cast from the fp32 master, and a master kept in memory leaves nothing to offload");
  TORCH_CHECK(options.read_ahead() >= 1, "fully_shard: NvmeOffloadOptions::read_ahead must be at least 1 unit, got ",
              options.read_ahead());
  TORCH_CHECK(options.max_read_ahead() == 0 || options.max_read_ahead() >= options.read_ahead(),
              "fully_shard: NvmeOffloadOptions::max_read_ahead must be 0 (fixed) or at least read_ahead (",
              options.read_ahead(), "), got ", options.max_read_ahead());
  TORCH_CHECK(options.deepen_above() >= 0 && options.deepen_above() <= 1,
              "fully_shard: NvmeOffloadOptions::deepen_above is a share of the step, from 0 to 1, got ", options.deepen_above());
}

NvmeOffload::NvmeOffload(const FullyShardOptions& options)
    : options_(*options.offload().nvme_options()),
      param_dtype_(options.mixed_precision().param_dtype()),
      read_ahead_(options_.read_ahead()) {
  // The store has a slot per unit's gradient where a clipped step would
  // write them out (nvme_step_schedule: strategies that keep whole
  // gradients hand none over).
  writes_gradients_ = nvme_step_schedule(options_, options.strategy(), /*clips_gradients=*/true, /*scales_loss=*/false) ==
                      NvmeStepSchedule::kBeforeNextGather;
  // With fp32 parameters the master is what the all-gather sends: it goes
  // with the parameters. Otherwise it is optimizer state (a param-dtype copy
  // stays for the gathers).
  offload_master_ = param_dtype_ == torch::kFloat ? options_.params() : options_.optimizer_state();
}

void NvmeOffload::prepare(FsdpState& state, const std::vector<ShardPlan>& shards) {
  state_ = &state;
  const bool fp32 = param_dtype_ == torch::kFloat;
  std::vector<int64_t> slot_bytes;
  std::vector<std::string> slot_labels;  // the trace's names of the requests: "unit 3 exp_avg"
  size_t u = 0;
  auto add_slot = [&](int64_t bytes, const char* what) {
    slot_bytes.push_back(bytes);
    slot_labels.push_back("unit " + std::to_string(u) + " " + what);
    return static_cast<int>(slot_bytes.size() - 1);
  };
  flats_.assign(shards.size(), nullptr);
  planned_.clear();
  for (; u < shards.size(); ++u) {
    planned_.push_back(std::make_unique<UnitSlots>());
    UnitSlots& slots = *planned_.back();
    slots.numel = shards[u].numel;
    slots.frozen = shards[u].frozen;
    if (slots.numel == 0) continue;
    const int64_t fp32_bytes = slots.numel * 4;
    if (offload_master_) slots.master = add_slot(fp32_bytes, "master");
    if (options_.params() && !fp32) slots.compute = add_slot(slots.numel * c10::elementSize(param_dtype_), "params");
    if (slots.frozen) continue;  // never stepped: its parameters alone
    if (options_.optimizer_state()) {
      slots.exp_avg = add_slot(fp32_bytes, "exp_avg");
      slots.exp_avg_sq = add_slot(fp32_bytes, "exp_avg_sq");
    }
    if (writes_gradients_) slots.grad = add_slot(fp32_bytes, "grad");
  }
  offload::DiskStoreOptions store_options = options_.store();
  store_options.name(offload::rank_scratch_name(state.group()->rank()));
  store_ = std::make_unique<DiskStore>(store_options, slot_bytes, slot_labels);
}

void NvmeOffload::unit_built(FlatParam& flat) {
  const size_t u = flat.index();
  TORCH_CHECK(store_ && u < planned_.size() && planned_[u], "NvmeOffload: unit ", u,
              " was built without its slots (prepare() plans every unit once)");
  TORCH_CHECK(planned_[u]->numel == flat.shard_numel(), "NvmeOffload: unit ", u, " was planned with a shard of ",
              planned_[u]->numel, " elements and built with ", flat.shard_numel());
  flats_[u] = &flat;
  flat.set_offload_state(std::move(planned_[u]));
  // Its offloaded state leaves memory now, before the next unit is built:
  // a sharded initialization never holds every shard at once.
  UnitSlots& slots = slots_of(flat);
  if (slots.numel == 0) return;
  torch::NoGradGuard no_grad;
  if (offload_master_ && param_dtype_ != torch::kFloat && !options_.params()) {
    MemoryCategoryScope scope(Category::kParameterShard);
    slots.compute_copy = flat.shard().detach().to(param_dtype_);
  }
  Futures writes = issue_writes(u, nullptr, /*only_changed=*/false);
  wait(writes);
  free_unit(u, nullptr);
}

NvmeOffload::~NvmeOffload() {
  // Nothing the store still reads into or writes from may go before it.
  discard_read_ahead();
  for (size_t u = 0; u < num_units(); ++u) {  // the units outlive this (FsdpState's offload_ goes first)
    if (!flats_[u]) continue;  // a construction that failed before it
    const FlatParam& flat = *flats_[u];
    if (flat.offload_state() && slots_of(flat).state_reads) drain(*slots_of(flat).state_reads);
  }
  for (auto& behind : writes_behind_) drain(behind.writes);
}

void NvmeOffload::discard_read_ahead() noexcept {
  for (Ahead& ahead : ahead_) drain(ahead.reads);
  ahead_.clear();
}

OffloadStats NvmeOffload::stats() const {
  OffloadStats stats = store_->io_times();
  stats.bytes_read = store_->bytes_read();
  stats.bytes_written = store_->bytes_written();
  stats.wait_seconds = wait_ns_.load() * 1e-9;
  stats.read_ahead = read_ahead_;
  return stats;
}

std::optional<NvmeOffloadInfo> NvmeOffload::nvme_info() const {
  return NvmeOffloadInfo{options_.optimizer_state(),
                         options_.params(),
                         store_->path(),
                         store_->engine_description(),
                         static_cast<int64_t>(store_->file_bytes()),
                         last_step_in_backward_,
                         last_step_deferred_,
                         stats()};
}

GatherInput NvmeOffload::fetch(const FlatParam& flat) {
  // Until unit_built() (the units' first gathers, while they are built) the
  // shards are in memory still.
  const size_t unit = flat.index();
  if (!flat.offload_state() || slots_of(flat).numel == 0) return ShardOffload::fetch(flat);
  // The update the last step left pending: the gather sends its result.
  if (slots_of(flat).pending) step_pending(unit);
  if (!(offload_master_ || options_.params())) return ShardOffload::fetch(flat);
  GatherInput input;
  input.values = compute_shard(unit);
  return input;
}

void NvmeOffload::set_resident(const FlatParam& flat, const UnitStepper* stepper, bool resident) {
  if (resident) {
    bring_in(flat.index(), stepper);
  } else {
    send_out(flat.index(), stepper);
  }
}

std::optional<NvmeOffload::Moments> NvmeOffload::moments_of(size_t unit, const UnitStepper* stepper) const {
  if (!stepper || !options_.optimizer_state() || unit_slots(unit).numel == 0) return std::nullopt;
  std::vector<torch::Tensor> moments = stepper->moments(*flats_[unit]);
  if (moments.empty()) return std::nullopt;
  return Moments{moments[0], moments[1]};
}

void NvmeOffload::wait(Futures& futures) {
  const auto start = Clock::now();
  const double begin_us = trace::enabled() && !futures.empty() ? trace::now_us() : -1.0;
  const size_t requests = futures.size();
  try {
    for (auto& f : futures) f.get();
  } catch (...) {
    drain(futures);
    throw;
  }
  futures.clear();
  wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  trace::complete("wait for disk", "offload", begin_us, std::to_string(requests) + " requests");
}

void NvmeOffload::drain(Futures& futures) noexcept {
  for (auto& f : futures) {
    if (f.valid()) f.wait();
  }
  futures.clear();
}

NvmeOffload::Futures NvmeOffload::issue_reads(size_t unit, const UnitStepper* stepper) {
  Futures futures;
  try {
    issue_reads_into(unit, stepper, futures);
  } catch (...) {
    drain(futures);  // what was queued before the error lands before its memory can go
    throw;
  }
  return futures;
}

void NvmeOffload::issue_reads_into(size_t unit, const UnitStepper* stepper, Futures& futures) {
  UnitSlots& slots = unit_slots(unit);
  if (slots.numel == 0) return;
  settle_writes(unit);  // a slot is read only once its write has landed
  torch::NoGradGuard no_grad;
  const torch::Tensor& shard = (*flats_[unit]).shard();
  if (slots.master >= 0 && !in_memory(shard, slots.numel)) {
    TORCH_CHECK(slots.master_on_disk, "NvmeOffload: the master shard of unit ", unit, " is neither in memory nor on disk");
    torch::Tensor buffer = fresh(slots.numel, torch::kFloat, Category::kParameterShard);
    shard.set_data(buffer);
    futures.push_back(store_->read(slots.master, buffer.data_ptr()));
  }
  if (auto moments = moments_of(unit, stepper)) {
    for (auto [tensor, slot] : {std::pair{moments->exp_avg, slots.exp_avg}, {moments->exp_avg_sq, slots.exp_avg_sq}}) {
      if (in_memory(tensor, slots.numel)) continue;
      TORCH_CHECK(slots.moments_on_disk, "NvmeOffload: the optimizer state of unit ", unit,
                  " is neither in memory nor on disk");
      torch::Tensor buffer = fresh(slots.numel, torch::kFloat, Category::kOptimizerState);
      tensor.set_(buffer);
      futures.push_back(store_->read(slot, buffer.data_ptr()));
    }
  }
}

NvmeOffload::Futures NvmeOffload::issue_writes(size_t unit, const UnitStepper* stepper, bool only_changed) {
  UnitSlots& slots = unit_slots(unit);
  Futures futures;
  if (slots.numel == 0) return futures;
  torch::NoGradGuard no_grad;
  const torch::Tensor& shard = (*flats_[unit]).shard();
  const bool master_changed = !only_changed || shard._version() != slots.master_version;
  if (master_changed && in_memory(shard, slots.numel)) {
    // The copies the all-gathers read follow the master.
    if (slots.compute_copy.defined()) slots.compute_copy.copy_(shard.detach());
    if (slots.compute >= 0) {
      {
        MemoryCategoryScope scope(Category::kOther);
        slots.compute_out = shard.detach().to(param_dtype_);
      }
      futures.push_back(store_->write(slots.compute, slots.compute_out.data_ptr()));
      slots.compute_on_disk = true;
    }
    if (slots.master >= 0) {
      futures.push_back(store_->write(slots.master, shard.data_ptr()));
      slots.master_on_disk = true;
    }
  }
  if (auto moments = moments_of(unit, stepper)) {
    const bool changed = !only_changed || !slots.moments_on_disk ||
                         moments->exp_avg._version() != slots.exp_avg_version ||
                         moments->exp_avg_sq._version() != slots.exp_avg_sq_version;
    if (changed && in_memory(moments->exp_avg, slots.numel) && in_memory(moments->exp_avg_sq, slots.numel)) {
      futures.push_back(store_->write(slots.exp_avg, moments->exp_avg.data_ptr()));
      futures.push_back(store_->write(slots.exp_avg_sq, moments->exp_avg_sq.data_ptr()));
      slots.moments_on_disk = true;
    }
  }
  return futures;
}

void NvmeOffload::free_unit(size_t unit, const UnitStepper* stepper) {
  UnitSlots& slots = unit_slots(unit);
  if (slots.numel == 0) return;
  torch::NoGradGuard no_grad;
  slots.compute_out = torch::Tensor();
  const torch::Tensor& shard = (*flats_[unit]).shard();
  if (slots.master >= 0 && slots.master_on_disk) shard.set_data(torch::empty({0}, shard.options()));
  if (auto moments = moments_of(unit, stepper)) {
    if (slots.moments_on_disk) {
      moments->exp_avg.set_(torch::empty({0}, moments->exp_avg.options()));
      moments->exp_avg_sq.set_(torch::empty({0}, moments->exp_avg_sq.options()));
    }
  }
}

void NvmeOffload::bring_in(size_t unit, const UnitStepper* stepper) {
  // What the scope changes is written back when it ends: a parameter read
  // issued ahead before then would hold the old values.
  discard_read_ahead();
  // A pending update first (written, then read back with the rest).
  if (unit_slots(unit).pending) step_pending(unit);
  Futures reads = issue_reads(unit, stepper);
  wait(reads);
  UnitSlots& slots = unit_slots(unit);
  if (slots.numel == 0) return;
  slots.master_version = (*flats_[unit]).shard()._version();
  if (auto moments = moments_of(unit, stepper)) {
    slots.exp_avg_version = moments->exp_avg._version();
    slots.exp_avg_sq_version = moments->exp_avg_sq._version();
  }
}

void NvmeOffload::send_out(size_t unit, const UnitStepper* stepper) {
  Futures writes = issue_writes(unit, stepper, /*only_changed=*/true);
  wait(writes);
  free_unit(unit, stepper);
}

NvmeOffload::Futures NvmeOffload::read_compute(size_t unit, torch::Tensor& into) {
  settle_writes(unit);
  const UnitSlots& slots = unit_slots(unit);
  const bool from_master = slots.compute < 0;  // fp32 parameters: the master is what is gathered
  TORCH_CHECK(from_master ? slots.master_on_disk : slots.compute_on_disk, "NvmeOffload: the parameters of unit ", unit,
              " are not on disk");
  into = fresh(slots.numel, from_master ? torch::kFloat : param_dtype_, Category::kUnshardedBuffer);
  return Futures{store_->read(from_master ? slots.master : slots.compute, into.data_ptr())};
}

torch::Tensor NvmeOffload::compute_shard(size_t unit) {
  UnitSlots& slots = unit_slots(unit);
  torch::NoGradGuard no_grad;
  const torch::Tensor& shard = (*flats_[unit]).shard();
  if (slots.compute_copy.defined()) return slots.compute_copy;
  const size_t position = fetch_order_this_.size();
  fetch_order_this_.push_back(unit);
  // Stepping in backward with fp32 parameters, the master this gather sends
  // is the one the step updates: read once, with the unit's moments.
  if (steps_in_backward() && slots.compute < 0) read_state(unit);
  if (slots.state_reads) wait(*slots.state_reads);
  torch::Tensor values;
  if (in_memory(shard, slots.numel)) {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    values = shard.detach().to(param_dtype_);  // as the gather casts a shard in memory
    while (!ahead_.empty() && ahead_.front().unit == unit) {  // read before the state's read made it resident
      drain(ahead_.front().reads);
      ahead_.pop_front();
    }
  } else if (!ahead_.empty() && ahead_.front().unit == unit) {
    Ahead ahead = std::move(ahead_.front());
    ahead_.pop_front();
    wait(ahead.reads);
    values = std::move(ahead.values);
  } else {
    discard_read_ahead();  // reads ahead for units that did not come next
    Futures reads = read_compute(unit, values);
    wait(reads);
  }
  read_ahead_after(position, unit);
  return values;  // read in the param dtype (fp32 parameters: the master's slot)
}

void NvmeOffload::read_ahead_after(size_t position, size_t unit) {
  // The next units of the last step's order, read while this one is
  // gathered and computes: only while this step follows that order.
  if (position >= fetch_order_last_.size() || fetch_order_last_[position] != unit) return;
  const size_t depth = static_cast<size_t>(read_ahead_);
  // After the last read queued: a step in backward may have taken reads
  // from the middle of the queue (read_state), so its length does not say.
  size_t next = position + 1;
  if (!ahead_.empty()) next = std::max(next, ahead_.back().position + 1);
  for (; ahead_.size() < depth && next < fetch_order_last_.size(); ++next) {
    const size_t u = fetch_order_last_[next];
    // A unit whose state a step in backward reads brings its master with it.
    const UnitSlots& slots = unit_slots(u);
    const bool read_with_state = (steps_in_backward() && slots.compute < 0 && !slots.frozen) || slots.pending;
    if (slots.numel == 0 || read_with_state ||
        in_memory((*flats_[u]).shard(), slots.numel)) {
      break;  // keep the queue in fetch order: no gaps
    }
    Ahead ahead;
    ahead.unit = u;
    ahead.position = next;
    ahead.reads = read_compute(u, ahead.values);
    ahead_.push_back(std::move(ahead));
  }
}

void NvmeOffload::adapt_read_ahead() {
  const auto now = Clock::now();
  const int64_t waited_ns = wait_ns_.load() - wait_ns_at_last_step_;
  const int64_t step_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_step_at_).count();
  // From the second step on: the first read nothing ahead (no order yet),
  // and its interval began when the model was built.
  if (steps_ > 0 && read_ahead_ < options_.max_read_ahead() &&
      static_cast<double>(waited_ns) >= options_.deepen_above() * static_cast<double>(step_ns)) {
    ++read_ahead_;
  }
  last_step_at_ = now;
  wait_ns_at_last_step_ = wait_ns_.load();
}

bool NvmeOffload::begin_step_in_backward(std::shared_ptr<const UnitStepper> stepper,
                                         const StepPreparation& preparation) {
  const NvmeStepSchedule schedule =
      nvme_step_schedule(options_, state_->options().strategy(), preparation.clips, preparation.unscale.has_value());
  if (schedule == NvmeStepSchedule::kAfterBackward) return false;
  step_all_pending();  // a unit no forward needed since the last step
  for (size_t u = 0; u < num_units(); ++u) (*flats_[u]).prepared_gradient().reset();
  backward_stepper_ = std::move(stepper);
  if (schedule == NvmeStepSchedule::kBeforeNextGather) {
    preparing_ = preparation;
    return true;
  }
  for (size_t u = 0; u < num_units(); ++u) unit_slots(u).stepped_in_backward = false;
  grad_order_this_.clear();
  // The first units to get their gradient: their state is read while backward starts.
  for (size_t i = 0; i < grad_order_last_.size() && i < static_cast<size_t>(read_ahead_); ++i) {
    read_state(grad_order_last_[i]);
  }
  return true;
}

void NvmeOffload::read_state(size_t unit) {
  UnitSlots& slots = unit_slots(unit);
  if (slots.numel == 0 || slots.frozen || slots.stepped_in_backward || slots.state_reads) return;
  Futures reads;
  if (slots.compute < 0) {
    // fp32 parameters: a master read ahead for the gather (issued before
    // this backward began) becomes the shard the step updates.
    const auto ahead = std::find_if(ahead_.begin(), ahead_.end(), [unit](const Ahead& a) { return a.unit == unit; });
    if (ahead != ahead_.end()) {
      torch::NoGradGuard no_grad;
      (*flats_[unit]).shard().set_data(ahead->values);
      reads = std::move(ahead->reads);
      ahead_.erase(ahead);
    }
  }
  Futures more = issue_reads(unit, backward_stepper_.get());
  reads.insert(reads.end(), more.begin(), more.end());
  slots.state_reads = std::move(reads);
}

void NvmeOffload::accept_gradient(FlatParam& flat, torch::Tensor reduced) {
  const size_t unit = flat.index();
  if (flat.offload_state() && slots_of(flat).pending) step_pending(unit);  // the last step's, before this one's
  ShardOffload::accept_gradient(flat, std::move(reduced));
  if (!backward_stepper_ || !flat.offload_state() || slots_of(flat).numel == 0) return;
  if (!backward_stepper_->steps(flat)) return;  // not the optimizer's: left to step()
  if (preparing_) {
    write_out_gradient(unit);
  } else {
    step_now(unit);
  }
}

void NvmeOffload::write_out_gradient(size_t unit) {
  UnitSlots& slots = unit_slots(unit);
  torch::NoGradGuard no_grad;
  const FlatParam& flat = *flats_[unit];
  const torch::Tensor& shard = flat.shard();
  torch::Tensor grad = shard.grad();
  TORCH_CHECK(grad.scalar_type() == torch::kFloat && grad.is_contiguous() && grad.numel() == slots.numel,
              "NvmeOffload: the gradient of unit ", unit, " is not contiguous float32 of its shard's ", slots.numel,
              " elements (", grad.scalar_type(), ", ", grad.numel(), " elements)");
  // Its figures on the unit, for clipping and the loss scaler; its values out.
  flat.prepared_gradient() = prepare_gradient(grad, *preparing_);
  shard.mutable_grad() = torch::Tensor();
  WriteBehind behind{unit, nullptr, Futures{}, grad};
  behind.writes.push_back(store_->write(slots.grad, grad.data_ptr()));
  writes_behind_.push_back(std::move(behind));
  retire_writes(2);
}

void NvmeOffload::read_pending(size_t unit) {
  UnitSlots& slots = unit_slots(unit);
  if (!slots.pending || slots.state_reads || slots.numel == 0) return;
  Futures reads = issue_reads(unit, slots.pending->stepper.get());  // the master where it is out, the moments
  try {
    slots.grad_in = fresh(slots.numel, torch::kFloat, Category::kGradientShard);
    reads.push_back(store_->read(slots.grad, slots.grad_in.data_ptr()));
  } catch (...) {
    drain(reads);
    throw;
  }
  slots.state_reads = std::move(reads);
}

void NvmeOffload::step_pending(size_t unit) {
  UnitSlots& slots = unit_slots(unit);
  const std::shared_ptr<DeferredStep> deferred = slots.pending;
  // The next pending units' state is read while this one steps and computes.
  if (pending_next_ < pending_order_.size() && pending_order_[pending_next_] == unit) {
    ++pending_next_;
    const size_t depth = static_cast<size_t>(read_ahead_);
    for (size_t i = pending_next_; i < pending_order_.size() && i < pending_next_ + depth; ++i) {
      read_pending(pending_order_[i]);
    }
  }
  read_pending(unit);
  Futures reads = std::move(*slots.state_reads);
  slots.state_reads.reset();
  wait(reads);
  torch::NoGradGuard no_grad;
  const torch::Tensor& shard = (*flats_[unit]).shard();
  const torch::Tensor kept = shard.grad();  // a gradient of the step under way (none in a plain loop)
  shard.mutable_grad() = std::move(slots.grad_in);
  slots.grad_in = torch::Tensor();
  deferred->stepper->update(*flats_[unit], slots.clip_coefficient);
  shard.mutable_grad() = kept;
  slots.pending.reset();
  writes_behind_.push_back({unit, deferred->stepper, issue_writes(unit, deferred->stepper.get(), false), {}});
  if (!std::exchange(deferred->started, true)) {
    maybe_fault_offload_for_test(state_->group()->rank(), deferred->number, store_->reachable_path(), true);
  }
  retire_writes(1);
}

void NvmeOffload::step_all_pending() {
  for (size_t u = 0; u < num_units(); ++u) {
    if (unit_slots(u).pending) step_pending(u);
  }
  retire_writes(0);
}

void NvmeOffload::step_now(size_t unit) {
  const size_t position = grad_order_this_.size();
  grad_order_this_.push_back(unit);
  // The next units' state (in the last step's order) is read while this one
  // steps and the next one's backward computes.
  if (position < grad_order_last_.size() && grad_order_last_[position] == unit) {
    for (size_t i = position + 1; i < grad_order_last_.size() && i <= position + static_cast<size_t>(read_ahead_); ++i) {
      read_state(grad_order_last_[i]);
    }
  }
  read_state(unit);
  UnitSlots& slots = unit_slots(unit);
  TORCH_CHECK(slots.state_reads, "fsdp: unit ", unit, " stepped twice in one backward");
  Futures reads = std::move(*slots.state_reads);
  slots.state_reads.reset();
  wait(reads);
  backward_stepper_->update(*flats_[unit]);
  torch::NoGradGuard no_grad;
  (*flats_[unit]).shard().mutable_grad() = torch::Tensor();  // the point: freed at once
  slots.stepped_in_backward = true;
  writes_behind_.push_back(
      {unit, backward_stepper_, issue_writes(unit, backward_stepper_.get(), /*only_changed=*/false), {}});
  if (position == 0) maybe_fault_offload_for_test(state_->group()->rank(), steps_ + 1, store_->reachable_path(), true);
  retire_writes(1);
}

void NvmeOffload::retire_writes(size_t keep) {
  while (writes_behind_.size() > keep) {
    WriteBehind behind = std::move(writes_behind_.front());
    writes_behind_.pop_front();
    wait(behind.writes);  // drains them before an error leaves
    free_unit(behind.unit, behind.stepper.get());
  }
}

void NvmeOffload::settle_writes(size_t unit) {
  for (size_t i = writes_behind_.size(); i-- > 0;) {
    if (writes_behind_[i].unit == unit) return retire_writes(writes_behind_.size() - i - 1);
  }
}

void NvmeOffload::finish_backward() {
  retire_writes(0);
  const bool stepped_in_backward = backward_stepper_ && !preparing_;
  preparing_.reset();
  if (!stepped_in_backward) {
    backward_stepper_.reset();
    return;
  }
  // State read for a unit that got no gradient: back out (nothing changed).
  for (size_t u = 0; u < num_units(); ++u) {
    UnitSlots& slots = unit_slots(u);
    if (!slots.state_reads) continue;
    Futures reads = std::move(*slots.state_reads);
    slots.state_reads.reset();
    wait(reads);
    free_unit(u, backward_stepper_.get());
  }
  grad_order_last_ = std::move(grad_order_this_);
  grad_order_this_.clear();
  backward_stepper_.reset();
}

std::shared_ptr<NvmeOffload::DeferredStep> NvmeOffload::defer_step(const UnitStepper& stepper) {
  std::shared_ptr<DeferredStep> deferred;
  for (size_t u = 0; u < num_units(); ++u) {
    UnitSlots& slots = unit_slots(u);
    const FlatParam& flat = *flats_[u];
    if (!flat.prepared_gradient() || !stepper.steps(flat)) continue;
    if (!deferred) {
      deferred = std::make_shared<DeferredStep>();
      deferred->stepper = stepper.for_later();
      deferred->number = steps_ + 1;
    }
    slots.pending = deferred;
    slots.clip_coefficient = flat.prepared_gradient()->clip_coefficient;
    flat.prepared_gradient().reset();
  }
  if (!deferred) return deferred;
  // Expected in the order this step gathered its units (read from the
  // first one's gather on: between steps the offloaded state is out).
  pending_order_.clear();
  pending_next_ = 0;
  std::vector<bool> listed(num_units(), false);
  auto list = [&](size_t u) {
    if (!listed[u] && unit_slots(u).pending) pending_order_.push_back(u);
    listed[u] = true;
  };
  for (size_t u : fetch_order_last_) list(u);
  for (size_t u = 0; u < num_units(); ++u) list(u);
  return deferred;
}

void NvmeOffload::step(FsdpState& /*state: the one prepared*/, const UnitStepper& stepper) {
  discard_read_ahead();  // the step rewrites every unit
  adapt_read_ahead();
  step_all_pending();     // a unit no forward needed since the last step
  fetch_order_last_ = std::move(fetch_order_this_);
  fetch_order_this_.clear();
  std::vector<bool> stepped(num_units(), false);
  for (size_t u = 0; u < num_units(); ++u) stepped[u] = std::exchange(unit_slots(u).stepped_in_backward, false);
  last_step_in_backward_ = std::any_of(stepped.begin(), stepped.end(), [](bool b) { return b; });

  const std::shared_ptr<DeferredStep> deferred = defer_step(stepper);
  last_step_deferred_ = deferred != nullptr;
  std::vector<size_t> order;
  for (size_t u = 0; u < num_units(); ++u) {
    FlatParam& flat = (*flats_[u]);
    if (!stepper.steps(flat) || stepped[u]) continue;
    if (slots_of(flat).numel == 0) {
      // An empty shard (this rank's part of a unit whose parameters are all
      // frozen, as LoRA's root): nothing on disk, but the optimizer keeps its
      // step count, as it does in memory (the checkpoint's metadata reads it).
      if (flat.shard().grad().defined()) stepper.update(flat);
      continue;
    }
    if (slots_of(flat).pending) continue;  // left for its next gather (defer_step)
    if (flat.shard().grad().defined()) {
      order.push_back(u);
    } else if (stepper.matrix_weight_decay() > 0) {
      // No update without a gradient, but decay_matrix_weights_ decays
      // every shard in memory: so does this.
      bring_in(u, nullptr);
      stepper.decay(flat);
      send_out(u, nullptr);
    }
  }
  // Read the next, step this one, write the previous: at most three units'
  // state in memory. Every request in flight is waited for before an error
  // leaves, so no buffer is freed under the store.
  std::vector<Futures> reads(order.size()), writes(order.size());
  try {
    if (!order.empty()) reads[0] = issue_reads(order[0], &stepper);
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t u = order[i];
      if (i + 1 < order.size()) reads[i + 1] = issue_reads(order[i + 1], &stepper);
      wait(reads[i]);
      stepper.update(*flats_[u]);
      writes[i] = issue_writes(u, &stepper, /*only_changed=*/false);
      if (i == 0) maybe_fault_offload_for_test(state_->group()->rank(), steps_ + 1, store_->reachable_path(), true);
      if (i > 0) {
        wait(writes[i - 1]);
        free_unit(order[i - 1], &stepper);
      }
    }
    if (!order.empty()) {
      wait(writes.back());
      free_unit(order.back(), &stepper);
    }
  } catch (...) {
    for (auto& f : reads) drain(f);
    for (auto& f : writes) drain(f);
    throw;
  }
  ++steps_;
  maybe_fault_offload_for_test(state_->group()->rank(), steps_, store_->reachable_path(), false);
}

}  // namespace fsdp::offload

