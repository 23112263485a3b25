// The NCCL backend (the CUDA configuration; built into the CUDA module,
// comm/cuda_module.h). Collectives are raw NCCL calls on the group's own
// streams; the host never waits for them except in barrier(). Ordering is by CUDA events:
//   issue:  the collective's stream waits for the caller's current (compute)
//           stream, so the buffers' producers have run; a caller whose
//           current stream is the group's own (FSDP's ordered gathers,
//           src/core/gather_order.h) has ordered it itself;
//   wait(): the compute stream waits for the collective's end event, with a
//           pair of timing events around that wait: the time the compute
//           stream stood still is the exposed communication stats() gives.
// Buffer lifetimes are explicit: a collective's Work holds its tensors until
// wait() has ordered the compute stream after it, so no recordStream is
// needed (FSDP2's rule, kept by construction).
//
// Failures surface with NCCL's text, not as timeouts: the communicator is
// non-blocking (its set-up and each call are polled against the group's
// timeout), and the watchdog (comm/collective_watchdog.h) polls its
// asynchronous error and the end events of the collectives in flight; an
// error or a collective past the timeout aborts the communicator and ends
// the job with a message naming the call (NCCL cannot be cancelled
// otherwise, and a host that never waits would never notice).

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <mutex>
#include <thread>

#include "comm/all_to_all_check.h"
#include "comm/collective_watchdog.h"
#include "comm/cuda_module.h"
#include "fsdp/comm.h"

namespace fsdp {
namespace {

// NCCL's text for a result, with its last error's detail where it has one.
std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  const char* detail = ncclGetLastError(comm);
  return std::string(ncclGetErrorString(result)) + (detail && *detail ? std::string(" (") + detail + ")" : std::string());
}

void check_nccl(ncclResult_t result, const std::string& what) {
  TORCH_CHECK(result == ncclSuccess, "NCCL error in ", what, ": ", nccl_text(result, nullptr));
}

ncclDataType_t nccl_type(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return ncclFloat32;
    case torch::kDouble: return ncclFloat64;
    case torch::kHalf: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kInt: return ncclInt32;
    case torch::kLong: return ncclInt64;
    case torch::kByte: return ncclUint8;
    case torch::kChar: return ncclInt8;
    default: TORCH_CHECK(false, "NCCL collectives support float32/64, bfloat16, float16, int8/32/64 and uint8, got ", type);
  }
}

ncclRedOp_t nccl_op(ReduceOp op, const torch::Tensor& t) {
  TORCH_CHECK(op != ReduceOp::kAvg || t.is_floating_point(), "an average needs a floating-point tensor, got ",
              t.scalar_type());
  return op == ReduceOp::kAvg ? ncclAvg : ncclSum;
}

// A CUDA event without timing, owned.
class Event {
 public:
  explicit Event(c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const c10::cuda::CUDAStream& stream) { C10_CUDA_CHECK(cudaEventRecord(event_, stream.stream())); }
  void block(const c10::cuda::CUDAStream& stream) const {
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event_, 0));
  }
  // cudaSuccess (done), cudaErrorNotReady (not yet, cleared), or an error.
  cudaError_t status() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) (void)cudaGetLastError();
    return status;
  }
  bool query() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    C10_CUDA_CHECK(status);
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// The time compute streams stood still waiting for collectives: a pair of
// timing events around each wait, read once the device has passed them.
// The wait itself never depends on the timing: an event CUDA cannot make or
// record costs the figure, not the order (review of issue 25). The caller
// holds a guard of the stream's device, where the events are made.
class ExposedWaits {
 public:
  ~ExposedWaits() { settle(); }
  // Runs `wait` (which queues the stream's wait) between the two events.
  template <class Wait>
  void measure(cudaStream_t stream, Wait wait) {
    cudaEvent_t before = recorded_timing_event(stream);
    try {
      wait();
    } catch (...) {
      if (before) cudaEventDestroy(before);
      throw;
    }
    cudaEvent_t after = before ? recorded_timing_event(stream) : nullptr;
    if (!after) {
      if (before) cudaEventDestroy(before);
      return;
    }
    bool many = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.emplace_back(before, after);
      many = pending_.size() >= 4096;  // nobody asks: keep the event count bounded
    }
    if (many) settled_s_ += settle();
  }
  // The seconds of the waits measured since the last call (blocks until the
  // device has passed them).
  double settle() {
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending.swap(pending_);
    }
    double seconds = 0;
    for (auto& [before, after] : pending) {
      float ms = 0;
      if (cudaEventSynchronize(after) == cudaSuccess && cudaEventElapsedTime(&ms, before, after) == cudaSuccess) {
        seconds += ms / 1e3;
      }
      cudaEventDestroy(before);
      cudaEventDestroy(after);
    }
    const double earlier = settled_s_;
    settled_s_ = 0;
    return seconds + earlier;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pending_;
  double settled_s_ = 0;  // settled early (the bound), not yet reported

  // A timing event recorded on `stream` now, or null where CUDA refused
  // (its error cleared: it is not the collective's).
  static cudaEvent_t recorded_timing_event(cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    if (cudaEventCreate(&event) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (cudaEventRecord(event, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaEventDestroy(event);
      return nullptr;
    }
    return event;
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Event> done, std::vector<torch::Tensor> buffers, c10::DeviceIndex device,
           std::shared_ptr<ExposedWaits> waits)
      : done_(std::move(done)), buffers_(std::move(buffers)), device_(device), waits_(std::move(waits)) {}
  // Never leave the buffers to a caching allocator while the collective may
  // still use them: an unwaited Work orders the compute stream on destruction.
  ~NcclWork() override {
    if (!waited_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (waited_) return;
    // The timing events are made on the current device, and must be the
    // stream's: a caller whose current device is another GPU (a library
    // user who never set it) would get CUDA's invalid-handle error.
    c10::cuda::CUDAGuard on_device(device_);
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device_);
    waits_->measure(stream.stream(), [&] { done_->block(stream); });
    buffers_.clear();  // their next users are ordered after the collective now
    waited_ = true;
    run_on_wait_action();
  }
  bool is_completed() const override { return done_->query(); }

 private:
  std::shared_ptr<Event> done_;
  std::vector<torch::Tensor> buffers_;
  c10::DeviceIndex device_;
  std::shared_ptr<ExposedWaits> waits_;
  bool waited_ = false;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(ProcessGroupPtr bootstrap, c10::Device device)
      : bootstrap_(std::move(bootstrap)), device_(device) {
    TORCH_CHECK(device_.is_cuda() && device_.has_index(), "the NCCL process group needs a CUDA device with an index, got ",
                device_);
    TORCH_CHECK(device_.index() < c10::cuda::device_count(), "the NCCL process group: device ", device_,
                " does not exist; this process sees ", static_cast<int>(c10::cuda::device_count()), " GPUs");
    set_timeout(bootstrap_->timeout());
    check_one_rank_per_gpu();
    ncclUniqueId id;
    torch::Tensor bytes = torch::zeros({static_cast<int64_t>(sizeof(id))}, torch::kByte);
    if (bootstrap_->rank() == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data_ptr(), &id, sizeof(id));
    }
    bootstrap_->broadcast(bytes, 0)->wait();
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
    c10::cuda::CUDAGuard guard(device_);
    // Non-blocking: a peer that never joins, or a transport that cannot be
    // set up, fails within the timeout with NCCL's text instead of hanging.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t started = ncclCommInitRankConfig(&comm, bootstrap_->size(), id, bootstrap_->rank(), &config);
    comm_ = comm;
    settle_call(started, "ncclCommInitRankConfig (setting up the communicator of " + std::to_string(size()) + " ranks)");
    gather_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(true, device_.index()));
    reduce_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(true, device_.index()));
    watchdog_ = std::make_unique<CollectiveWatchdog>([this] { return communicator_error(); },
                                                     [this](const std::string& message) {
                                                       if (ncclComm_t comm = comm_.exchange(nullptr)) ncclCommAbort(comm);
                                                       MpiEnvironment::abort_with_message(message);
                                                     });
  }

  ~NcclProcessGroup() override {
    watchdog_.reset();
    if (!comm_.load()) return;
    // Destroyed while an error unwinds (a library user's; fsdp-train ends
    // the job with MPI_Abort and runs no destructor): a collective may be in
    // flight that never ends (a dead peer), which finalize would flush for
    // up to the timeout (600 s by default) before aborting, stalling the
    // exit of a job that has already failed. Aborted at once; its peers'
    // watchdogs name their own calls. Review of issue 25, "finalize".
    if (std::uncaught_exceptions() > 0) {
      if (ncclComm_t comm = comm_.exchange(nullptr)) ncclCommAbort(comm);
      return;
    }
    // Finalize flushes what is in flight; a communicator that cannot is
    // aborted rather than waited for past the timeout.
    try {
      settle_call(ncclCommFinalize(comm_), "ncclCommFinalize");
    } catch (...) {
      return;  // settle_call aborted it
    }
    ncclCommDestroy(comm_.load());
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }

  // CPU tensors (the engine's small control collectives, checkpoint
  // metadata, offloaded shards) go over the bootstrap MPI group.
  WorkHandle all_gather(torch::Tensor output, torch::Tensor input) override {
    if (on_host(output, input)) return bootstrap_->all_gather(output, input);
    check_buffer(output, "all_gather output");
    check_buffer(input, "all_gather input");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_gather: output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(output.numel() == input.numel() * size(), "all_gather: output must hold group size (", size(),
                ") x input elements (", input.numel(), ") = ", input.numel() * size(), ", found ", output.numel());
    count(CollectiveKind::kAllGather, output.nbytes());
    return issue(*gather_stream_, {output, input}, "all_gather", [&](cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), nccl_type(input.scalar_type()), comm_,
                           stream);
    });
  }

  WorkHandle reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op) override {
    if (on_host(output, input)) return bootstrap_->reduce_scatter(output, input, op);
    check_buffer(output, "reduce_scatter output");
    check_buffer(input, "reduce_scatter input");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "reduce_scatter: output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(input.numel() == output.numel() * size(), "reduce_scatter: input must hold group size (", size(),
                ") x output elements (", output.numel(), ") = ", output.numel() * size(), ", found ", input.numel());
    const ncclRedOp_t reduction = nccl_op(op, input);
    count(CollectiveKind::kReduceScatter, input.nbytes());
    return issue(*reduce_stream_, {output, input}, "reduce_scatter", [&](cudaStream_t stream) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(input.scalar_type()),
                               reduction, comm_, stream);
    });
  }

  WorkHandle all_reduce(torch::Tensor tensor, ReduceOp op) override {
    if (on_host(tensor, tensor)) return bootstrap_->all_reduce(tensor, op);
    check_buffer(tensor, "all_reduce tensor");
    const ncclRedOp_t reduction = nccl_op(op, tensor);
    count(CollectiveKind::kAllReduce, tensor.nbytes());
    return issue(*reduce_stream_, {tensor}, "all_reduce", [&](cudaStream_t stream) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_type(tensor.scalar_type()),
                           reduction, comm_, stream);
    });
  }

  // NCCL has no all-to-all: one send and one receive per peer, grouped so
  // that NCCL schedules them together (no pairwise ordering to deadlock on).
  // On the reduction stream: its users (ZeRO++'s gradient exchange) follow
  // a reduce-scatter there.
  WorkHandle all_to_all(torch::Tensor output, torch::Tensor input) override {
    if (on_host(output, input)) return bootstrap_->all_to_all(output, input);
    check_buffer(output, "all_to_all output");
    check_buffer(input, "all_to_all input");
    check_all_to_all(output, input, size());
    count(CollectiveKind::kAllToAll, input.nbytes());
    const int64_t block = input.numel() / size();
    const ncclDataType_t type = nccl_type(input.scalar_type());
    return issue(*reduce_stream_, {output, input}, "all_to_all", [&](cudaStream_t stream) {
      const auto* send = static_cast<const char*>(input.data_ptr());
      auto* receive = static_cast<char*>(output.data_ptr());
      const int64_t block_bytes = block * input.element_size();
      ncclResult_t result = ncclGroupStart();
      for (int peer = 0; peer < size() && (result == ncclSuccess || result == ncclInProgress); ++peer) {
        result = ncclSend(send + peer * block_bytes, block, type, peer, comm_, stream);
        if (result == ncclSuccess || result == ncclInProgress) {
          result = ncclRecv(receive + peer * block_bytes, block, type, peer, comm_, stream);
        }
      }
      const ncclResult_t ended = ncclGroupEnd();  // always closed, even after a failed call
      return result == ncclSuccess || result == ncclInProgress ? ended : result;
    });
  }

  WorkHandle broadcast(torch::Tensor tensor, int root) override {
    if (on_host(tensor, tensor)) return bootstrap_->broadcast(tensor, root);
    check_buffer(tensor, "broadcast tensor");
    TORCH_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of a group of size ", size());
    count(CollectiveKind::kBroadcast, tensor.nbytes());
    return issue(*gather_stream_, {tensor}, "broadcast", [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_type(tensor.scalar_type()), root,
                           comm_, stream);
    });
  }

  // The host waits here (and only here): every rank's GPU work queued so far
  // on the compute stream is done when it returns.
  WorkHandle barrier() override {
    c10::cuda::CUDAGuard guard(device_);
    torch::Tensor token = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    all_reduce(token, ReduceOp::kSum)->wait();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout());
    auto done = std::make_shared<Event>(device_.index());
    done->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    while (!done->query()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "collective watchdog: an NCCL barrier did not complete within ",
                  timeout(), " s; a rank has died, hangs, or did not make this call");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::promise<void> ready;
    ready.set_value();
    return std::make_shared<Work>(ready.get_future().share(), &wait_seconds_, "barrier", timeout());
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override { return on_device(bootstrap_->split(color, key)); }

  std::shared_ptr<ProcessGroup> split_shared_memory() override {
    return on_device(bootstrap_->split_shared_memory());
  }

  std::optional<c10::Stream> gather_stream() const override { return c10::Stream(*gather_stream_); }

  CommStats stats() const override {
    add_wait_seconds(exposed_waits_->settle());
    return ProcessGroup::stats();
  }

  void reset_stats() override {
    exposed_waits_->settle();
    ProcessGroup::reset_stats();
  }

 private:
  // A group of the same device over `bootstrap`: a group of one needs no
  // communicator (hybrid's replicate group with one node, say).
  ProcessGroupPtr on_device(const ProcessGroupPtr& bootstrap) const {
    ProcessGroupPtr group = bootstrap->size() == 1 ? make_local_process_group(device_)
                                                   : std::make_shared<NcclProcessGroup>(bootstrap, device_);
    group->set_timeout(timeout());
    return group;
  }

  void add_wait_seconds(double seconds) const {
    double seen = wait_seconds_.load();
    while (!wait_seconds_.compare_exchange_weak(seen, seen + seconds)) {
    }
  }

  // A call on the non-blocking communicator: an error is thrown with NCCL's
  // text; ncclInProgress is polled until done, at most the group's timeout,
  // past which the communicator is aborted.
  void settle_call(ncclResult_t result, const std::string& what) {
    if (result != ncclSuccess && result != ncclInProgress) fail(what, nccl_text(result, comm_));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout());
    while (result == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess) state = asked;
      if (state != ncclSuccess && state != ncclInProgress) fail(what, nccl_text(state, comm_));
      if (state == ncclSuccess) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        fail(what, "did not finish within " + c10::str(timeout()) +
                       " s (FSDP_COLLECTIVE_TIMEOUT); a rank has died, hangs, or cannot reach the others");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    // The watchdog may be reading the communicator: stopped first, so that
    // the abort never frees it under the watchdog's hands.
    watchdog_.reset();
    if (ncclComm_t comm = comm_.exchange(nullptr)) ncclCommAbort(comm);
    TORCH_CHECK(false, "NCCL error in ", what, ": ", why, ". The communicator is aborted.");
  }

  // For the watchdog: "" while the communicator is healthy.
  std::string communicator_error() const {
    const ncclComm_t comm = comm_;
    if (!comm) return "";  // aborted by a call that threw its own error
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return "ncclCommGetAsyncError: " + nccl_text(asked, comm);
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return nccl_text(state, comm);
  }

  static bool on_host(const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() && b.defined() && a.device().is_cpu() && b.device().is_cpu();
  }

  void check_buffer(const torch::Tensor& t, const char* what) const {
    TORCH_CHECK(t.defined(), what, " is undefined");
    TORCH_CHECK(t.device() == device_, "the NCCL process group moves tensors on ", device_, "; ", what, " is on ",
                t.device());
    TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
  }

  // NCCL refuses two ranks of one communicator on one GPU (and would hang
  // in some versions): refused here with what to do instead.
  void check_one_rank_per_gpu() const {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const int64_t place = static_cast<int64_t>(std::hash<std::string>()(host) & 0xffffffffffff) * 1024 + device_.index();
    torch::Tensor all = torch::empty({bootstrap_->size()}, torch::kLong);
    bootstrap_->all_gather(all, torch::tensor({place}, torch::kLong))->wait();
    for (int r = 0; r < bootstrap_->size(); ++r) {
      TORCH_CHECK(r == bootstrap_->rank() || all[r].item<int64_t>() != place, "the NCCL process group: ranks ", r,
                  " and ", bootstrap_->rank(), " both use GPU ", device_,
                  " of one host; NCCL needs one GPU per rank. To run several ranks on one GPU, use the MPI process "
                  "group (fsdp-train --backend mpi), which stages device tensors through host memory.");
    }
  }

  template <class Call>
  WorkHandle issue(const c10::cuda::CUDAStream& stream, std::vector<torch::Tensor> buffers, const char* what, Call call) {
    TORCH_CHECK(comm_, "the NCCL process group: its communicator was aborted after an earlier error; ", what,
                " cannot run");
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    if (current != stream) {
      Event ready(device_.index());
      ready.record(current);
      ready.block(stream);
    }
    int64_t sequence = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sequence = next_sequence_++;
    }
    std::string description = std::string(what) + " (call #" + std::to_string(sequence) + " of an NCCL group of " +
                              std::to_string(size()) + " ranks, this rank " + std::to_string(rank()) + ")";
    settle_call(call(stream.stream()), description);
    auto done = std::make_shared<Event>(device_.index());
    done->record(stream);
    const c10::DeviceIndex device = device_.index();
    watchdog_->track(
        std::move(description),
        [done, device] {
          c10::cuda::CUDAGuard on_device(device);
          const cudaError_t status = done->status();
          if (status == cudaSuccess) return CollectiveProgress{CollectiveProgress::State::kDone, ""};
          if (status == cudaErrorNotReady) return CollectiveProgress{CollectiveProgress::State::kRunning, ""};
          return CollectiveProgress{CollectiveProgress::State::kFailed, cudaGetErrorString(status)};
        },
        timeout());
    return std::make_shared<NcclWork>(std::move(done), std::move(buffers), device_.index(), exposed_waits_);
  }

  ProcessGroupPtr bootstrap_;
  c10::Device device_;
  std::atomic<ncclComm_t> comm_{nullptr};  // null once aborted
  std::unique_ptr<c10::cuda::CUDAStream> gather_stream_, reduce_stream_;
  std::shared_ptr<ExposedWaits> exposed_waits_ = std::make_shared<ExposedWaits>();
  int64_t next_sequence_ = 0;
  std::mutex mutex_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // last: stopped first
};

}  // namespace

// The CUDA module's side of fsdp::make_nccl_process_group and
// fsdp::cuda_device_count (comm/cuda_module.h).
namespace cuda_module::in_module {

ProcessGroupPtr make_nccl_process_group(const ProcessGroupPtr& bootstrap, c10::Device device) {
  TORCH_CHECK(bootstrap, "make_nccl_process_group: the bootstrap group is null");
  return std::make_shared<NcclProcessGroup>(bootstrap, device);
}

int device_count() { return static_cast<int>(c10::cuda::device_count()); }

}  // namespace cuda_module::in_module

}  // namespace fsdp
