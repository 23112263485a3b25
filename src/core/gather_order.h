#pragma once
// The order of a device run's parameter gathers (FSDP2's): the gather
// stream waits for the compute stream once per pass, and then runs ahead of
// it, so that a unit's all-gather overlaps the units computing before it.
//
// Without it every gather waited for all the compute queued before it
// (NCCL's issue order), so each unit's gather ran after the previous unit's
// compute, in series. What makes running ahead safe:
//   - what a gather reads (the shard, its cast) is written before the pass
//     (the optimizer step) or on the gather stream itself: the pass's one
//     wait, at its start, orders those;
//   - what it overwrites is memory the gather stream's pool hands out: a
//     unit's gathered buffer, once resharded, is held with an event recorded
//     on the compute stream after its last user, and released (to that pool)
//     only at a later gather, after the gather stream has waited for the
//     event. The newest one stays held: the gather after unit k's reshard
//     must not take unit k's block while unit k may still compute, so it
//     waits for unit k-1's users and may overlap unit k's compute. At most
//     one resharded buffer is held beyond what the prefetch limit allows,
//     as FSDP2 holds the previous all-gather's output.
// Only for shards in device memory (no CPU or NVMe offload, whose copies
// run on their own stream, after the compute stream) and groups with a
// gather stream of their own (ProcessGroup::gather_stream(): NCCL). Every
// decision is traced (category "order"), so the order is visible on a CPU
// too, where there are no events and the holds only delay frees
// (tests/test_prefetch.cpp drives it through a group that names a
// stream). Not installed.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

namespace c10 {
class DataPtr;
}  // namespace c10

namespace fsdp {

class GatherOrder {
 public:
  // `gather_stream`: the shard group's; `device`: where the units compute.
  GatherOrder(c10::Stream gather_stream, c10::Device device);
  ~GatherOrder();  // releases the buffers still held
  GatherOrder(const GatherOrder&) = delete;
  GatherOrder& operator=(const GatherOrder&) = delete;

  // A pass begins (the root's pre-forward, or a backward outside one): the
  // gather stream waits, once, for all the compute queued so far, and the
  // pass's gathers are issued on it.
  void begin_pass();
  // The pass is over (its backward finished, an evaluation forward ended, a
  // failed pass was recovered, the model is checked idle before a state
  // dict, checkpoint or UnshardScope): the held buffers are released, the
  // gather stream waiting for their last users first, and gathers wait for
  // the compute stream again.
  void end_pass();
  bool in_pass() const { return in_pass_; }

  // Before unit `unit`'s gather in a pass: the gather stream waits for the
  // frees of the held buffers but the newest, which are released. Returns
  // the gather stream, for the caller to make current until the gather is
  // issued (its buffers are made and filled there).
  c10::Stream enter(size_t unit);
  // Unit `unit`'s gathered buffer (`nbytes` of memory::gathered_usage()),
  // resharded: its users are queued on the compute stream. Held until a
  // later gather has waited for them.
  void hold(c10::DataPtr buffer, int64_t nbytes, size_t unit);

 private:
  struct Held;
  // The gather stream waits for the oldest held buffer's users, then the
  // buffer goes back to its pool; `when` is for the trace.
  void wait_and_release_front(const std::string& when);

  c10::Stream gather_stream_;
  c10::Device device_;
  bool in_pass_ = false;
  std::deque<std::unique_ptr<Held>> held_;  // oldest first
};

}  // namespace fsdp
