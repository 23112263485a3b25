// The backend-independent parts of process groups: work handles and byte counters.
#include "fsdp/comm.h"
#include "fsdp/trace.h"

#include <torch/torch.h>

#include <c10/util/Exception.h>

#include <cstdlib>

namespace fsdp {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kCount: break;
  }
  return "unknown";
}

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
  torch::Tensor failed = torch::tensor({error.empty() ? 0 : 1}, torch::kInt);
  group->all_reduce(failed, ReduceOp::kSum)->wait();
  if (failed.item<int>() == 0) return;
  TORCH_CHECK(false, error.empty() ? std::string("another rank failed; see its message") : error);
}

void ProcessGroup::count(CollectiveKind kind, int64_t bytes) {
  bytes_[static_cast<size_t>(kind)] += bytes;
  calls_[static_cast<size_t>(kind)] += 1;
}

}  // namespace fsdp
