// The backend-independent parts of process groups: work handles and byte counters.
#include "fsdp/comm.h"
#include "fsdp/trace.h"
#include "base/trace_events.h"

#include <torch/torch.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fsdp {

namespace detail {

const EnumNames& enum_names(EnumTag<CollectiveKind>) {
  static const EnumNames names = EnumNames::of<CollectiveKind>("collective", {
      {CollectiveKind::kAllGather, "all_gather"},
      {CollectiveKind::kReduceScatter, "reduce_scatter"},
      {CollectiveKind::kAllReduce, "all_reduce"},
      {CollectiveKind::kBroadcast, "broadcast"},
      {CollectiveKind::kAllToAll, "all_to_all"}});
  return names;
}

}  // namespace detail

Work::Work(std::shared_future<void> done, std::atomic<double>* wait_seconds, std::string description, double timeout_s)
    : done_(std::move(done)), wait_seconds_(wait_seconds), description_(std::move(description)), timeout_s_(timeout_s) {}

void Work::wait() {
  if (!is_completed()) {
    trace::Span span("wait", "wait", trace::enabled() ? description_ : "");
    auto start = std::chrono::steady_clock::now();
    const bool finished =
        done_.wait_for(std::chrono::duration<double>(timeout_s_)) == std::future_status::ready;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // atomic<double> has no fetch_add before C++20.
    double seen = wait_seconds_->load();
    while (!wait_seconds_->compare_exchange_weak(seen, seen + waited)) {
    }
    TORCH_CHECK(finished, "collective watchdog: ", description_, " did not complete within ", timeout_s_,
                " s; a rank has died, hangs, or did not make this call");
  }
  done_.get();  // rethrows the collective's error, if any
  run_on_wait_action();
}

void Work::run_on_wait_action() {
  if (!on_wait_) return;
  auto action = std::move(on_wait_);
  on_wait_ = nullptr;
  action();
}

bool Work::is_completed() const {
  return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

int64_t CommStats::total_bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

CommStats ProcessGroup::stats() const {
  CommStats s;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    s.bytes[i] = bytes_[i].load();
    s.calls[i] = calls_[i].load();
  }
  s.wait_seconds = wait_seconds_.load();
  return s;
}

void ProcessGroup::reset_stats() {
  for (size_t i = 0; i < bytes_.size(); ++i) {
    bytes_[i] = 0;
    calls_[i] = 0;
  }
  wait_seconds_ = 0.0;
}

void ProcessGroup::set_timeout(double seconds) {
  TORCH_CHECK(seconds > 0, "a collective timeout must be positive, got ", seconds);
  timeout_s_ = seconds;
}

double ProcessGroup::default_timeout() {
  if (const char* env = std::getenv("FSDP_COLLECTIVE_TIMEOUT")) {
    double seconds = std::atof(env);
    if (seconds > 0) return seconds;
  }
  return 600.0;
}

void throw_if_any_rank_failed(const ProcessGroupPtr& group, const std::string& error) {
  const int n = group->size();
  torch::Tensor failed = torch::empty({n}, torch::kInt);
  group->all_gather(failed, torch::tensor({error.empty() ? 0 : 1}, torch::kInt))->wait();
  const auto flags = failed.accessor<int, 1>();
  int first = 0;
  while (first < n && flags[first] == 0) ++first;
  if (first == n) return;
  // Every rank throws the first failing rank's own message, the same text
  // everywhere: a rank that fails first takes the job down (MPI_Abort) with
  // its message, and another rank's "someone else failed" must not be the one
  // that reaches the user (it once was, for a full disk under --save-final).
  torch::Tensor length = torch::tensor({static_cast<int64_t>(error.size())}, torch::kLong);
  group->broadcast(length, first)->wait();
  torch::Tensor text = torch::zeros({std::max<int64_t>(length.item<int64_t>(), 1)}, torch::kUInt8);
  if (group->rank() == first) std::memcpy(text.data_ptr(), error.data(), error.size());
  group->broadcast(text, first)->wait();
  const std::string message(static_cast<const char*>(text.data_ptr()), static_cast<size_t>(length.item<int64_t>()));
  const bool all_failed = std::all_of(flags.data(), flags.data() + n, [](int f) { return f != 0; });
  TORCH_CHECK(false, all_failed ? message : "rank " + std::to_string(first) + ": " + message);
}

void ProcessGroup::count(CollectiveKind kind, int64_t bytes) {
  bytes_[static_cast<size_t>(kind)] += bytes;
  calls_[static_cast<size_t>(kind)] += 1;
}

}  // namespace fsdp
