// The gathers' order on a device: one wait for the compute stream per pass,
// and freed buffers held until a later gather has waited for their users.

#include "core/gather_order.h"

#include <c10/core/Allocator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <string>

#include "fsdp/memory.h"
#include "fsdp/trace.h"
#include "base/memory_counters.h"
#include "base/trace_events.h"

namespace fsdp {

// A resharded buffer, and (on a device) the event after its last user.
struct GatherOrder::Held {
  c10::DataPtr buffer;
  int64_t nbytes = 0;
  size_t unit = 0;
  std::optional<c10::Event> freed;
};

namespace {
c10::Stream current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}
void trace_decision(const std::string& what) {
  if (trace::enabled()) trace::complete(what, "order", trace::now_us());
}
}  // namespace

GatherOrder::GatherOrder(c10::Stream gather_stream, c10::Device device)
    : gather_stream_(gather_stream), device_(device) {}

GatherOrder::~GatherOrder() {
  try {
    end_pass();
  } catch (...) {  // a device already failing: its error surfaces elsewhere
  }
}

void GatherOrder::begin_pass() {
  if (!device_.is_cpu()) {  // the host's work is done when it is issued
    c10::Event compute(device_.type());
    compute.record(current_stream(device_));
    compute.block(gather_stream_);
  }
  trace_decision("gather stream waits for the compute stream");
  in_pass_ = true;
}

void GatherOrder::end_pass() {
  // Released, a block goes back to the gather stream's pool, where any
  // allocation on that stream may take it at once, before our next pass's
  // wait: c10's streams come from a pool shared by the process's groups and
  // models (another model's pass may be running on the same stream). So the
  // stream waits for the block's users first, as a gather would (review of
  // issue 25: "end_pass releases held blocks without a wait").
  while (!held_.empty()) wait_and_release_front("at the end of the pass");
  in_pass_ = false;
}

c10::Stream GatherOrder::enter(size_t unit) {
  while (held_.size() > 1) wait_and_release_front("before unit " + std::to_string(unit) + "'s gather");
  trace_decision("gather of unit " + std::to_string(unit) + " on the gather stream");
  return gather_stream_;
}

void GatherOrder::hold(c10::DataPtr buffer, int64_t nbytes, size_t unit) {
  auto held = std::make_unique<Held>();
  held->buffer = std::move(buffer);
  held->nbytes = nbytes;
  held->unit = unit;
  if (!device_.is_cpu()) {
    held->freed.emplace(device_.type());
    held->freed->record(current_stream(device_));
  }
  trace_decision("hold unit " + std::to_string(unit) + "'s buffer");
  held_.push_back(std::move(held));
}

void GatherOrder::wait_and_release_front(const std::string& when) {
  Held& oldest = *held_.front();
  if (oldest.freed) oldest.freed->block(gather_stream_);
  trace_decision("gather stream waits for the free of unit " + std::to_string(oldest.unit) + ", " + when);
  memory::count_gathered_bytes(-oldest.nbytes);
  held_.pop_front();
}

}  // namespace fsdp
