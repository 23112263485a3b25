// The collective watchdog: the communicator's own error first (NCCL reports
// a failed peer or a network error there, long before any timeout), then the
// oldest collective in flight: failed, or past its deadline.

#include "comm/collective_watchdog.h"

#include <sstream>

namespace fsdp {

CollectiveWatchdog::CollectiveWatchdog(std::function<std::string()> communicator_error,
                                       std::function<void(const std::string&)> end_job,
                                       std::chrono::milliseconds interval)
    : communicator_error_(std::move(communicator_error)), end_job_(std::move(end_job)), interval_(interval) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::track(std::string description, std::function<CollectiveProgress()> poll, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(timeout_s));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({std::move(description), std::move(poll), deadline, timeout_s});
  }
  wake_.notify_one();
}

size_t CollectiveWatchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_.size();
}

void CollectiveWatchdog::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, interval_, [this] { return stopping_; });
      if (stopping_) return;
    }
    const std::string failure = check_once();
    if (failure.empty()) continue;
    end_job_(failure);
    return;
  }
}

std::string CollectiveWatchdog::check_once() {
  // The device is asked without the lock held: track() never waits on it.
  InFlight oldest;
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!in_flight_.empty()) {
      oldest = in_flight_.front();
      any = true;
    }
  }
  const std::string error = communicator_error_();
  if (!error.empty()) {
    return "collective watchdog: the communicator failed: " + error +
           (any ? " (while " + oldest.description + " was in flight)" : std::string()) + ". Ending the job.";
  }
  while (any) {
    const CollectiveProgress progress = oldest.poll();
    if (progress.state == CollectiveProgress::State::kFailed) {
      return "collective watchdog: " + oldest.description + " failed on the device: " + progress.error +
             ". Ending the job.";
    }
    if (progress.state == CollectiveProgress::State::kRunning) {
      if (std::chrono::steady_clock::now() < oldest.deadline) return "";
      std::ostringstream message;
      message << "collective watchdog: " << oldest.description << " did not complete within " << oldest.timeout_s
              << " s; a rank has died, hangs, or did not make this call. Ending the job.";
      return message.str();
    }
    // Done: in issue order, so the next one is the oldest now.
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.pop_front();
    any = !in_flight_.empty();
    if (any) oldest = in_flight_.front();
  }
  return "";
}

}  // namespace fsdp
