#pragma once
// The watchdog of a device group's collectives (NCCL's): a thread that
// notices what the host, which never waits for a device collective, would
// not. Kept free of CUDA so that its decisions are driven and tested on a
// CPU with injected failures (tests/test_collectives.cpp). Not installed.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace fsdp {

// How a collective in flight stands, as its device says.
struct CollectiveProgress {
  enum class State { kRunning, kDone, kFailed } state = State::kRunning;
  std::string error;  // kFailed: the device's text
};

class CollectiveWatchdog {
 public:
  // `communicator_error`: the communicator's asynchronous error, "" while it
  // is healthy (NCCL's ncclCommGetAsyncError). `end_job`: what a failure
  // calls, once, with the message (aborts the communicator and ends the
  // job; the watchdog stops after it, should it return). Polls every
  // `interval`.
  CollectiveWatchdog(std::function<std::string()> communicator_error, std::function<void(const std::string&)> end_job,
                     std::chrono::milliseconds interval = std::chrono::milliseconds(100));
  ~CollectiveWatchdog();  // stops the thread (collectives still tracked are forgotten)
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // A collective just issued, in issue order: `description` names it in
  // messages, `poll` asks its device how it stands, and it fails once it
  // has run for `timeout_s`.
  void track(std::string description, std::function<CollectiveProgress()> poll, double timeout_s);
  // Collectives tracked and not yet seen done.
  size_t in_flight() const;

 private:
  struct InFlight {
    std::string description;
    std::function<CollectiveProgress()> poll;
    std::chrono::steady_clock::time_point deadline;
    double timeout_s = 0;
  };
  void run();
  // The message of a failure seen in this round, "" for none.
  std::string check_once();

  std::function<std::string()> communicator_error_;
  std::function<void(const std::string&)> end_job_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fsdp
