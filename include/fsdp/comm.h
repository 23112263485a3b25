#pragma once
/// \file
/// Process groups: the collectives FSDP needs, asynchronous, behind one
/// interface. MpiEnvironment::world() gives the MPI backend's, make_nccl_process_group NCCL's.

#include <c10/core/Stream.h>
#include <torch/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include "fsdp/enum_names.h"

namespace fsdp {

/// How a reduction combines the ranks' tensors.
enum class ReduceOp {
  kSum,  ///< the element-wise sum
  kAvg   ///< the element-wise mean (the sum divided by the group's size; floating-point tensors only)
};

/// The collectives a group counts bytes for (see CommStats).
/// Named by enum_name, parsed by parse_enum: "all_gather", "reduce_scatter", "all_reduce",
/// "broadcast", "all_to_all".
enum class CollectiveKind {
  kAllGather,      ///< ProcessGroup::all_gather
  kReduceScatter,  ///< ProcessGroup::reduce_scatter
  kAllReduce,      ///< ProcessGroup::all_reduce
  kBroadcast,      ///< ProcessGroup::broadcast
  kAllToAll,       ///< ProcessGroup::all_to_all
  kCount           ///< the number of kinds (the size of CommStats' arrays), not a kind
};
namespace detail {
const EnumNames& enum_names(EnumTag<CollectiveKind>);  ///< "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all"
}  // namespace detail

/// An asynchronous collective. wait() blocks until it is done and rethrows the
/// error it failed with (on every rank, for mismatched collectives). It is
/// also the watchdog: a collective that has not completed within the group's
/// timeout (a rank died, hangs, or skipped it) throws, naming the call. The
/// transport is then stuck; the process should end (MpiEnvironment::abort).
/// A GPU collective's wait() (NcclWork) does not block the host: it orders
/// the caller's current stream after the collective.
class Work {
 public:
  /// A collective that is done when `done` is ready; `wait_seconds` (the
  /// group's counter, or null) accumulates the time wait() blocked;
  /// `description` names the call in a timeout's message.
  Work(std::shared_future<void> done, std::atomic<double>* wait_seconds, std::string description, double timeout_s);
  virtual ~Work() = default;
  /// Blocks until the collective is done (a GPU collective: orders the
  /// caller's current stream after it), rethrowing its error; throws naming
  /// the call after `timeout_s` seconds.
  virtual void wait();
  /// Whether the collective is done, without waiting.
  virtual bool is_completed() const;
  /// Runs `action` on the waiting thread once the collective is done, before
  /// wait() returns (the host-staged MPI path copies results back to the
  /// device with it, in the caller's stream order).
  void then_on_wait(std::function<void()> action) { on_wait_ = std::move(action); }

 protected:
  Work() = default;
  /// Runs (once) the action then_on_wait() set: derived wait()s call it.
  void run_on_wait_action();

 private:
  std::shared_future<void> done_;
  std::atomic<double>* wait_seconds_ = nullptr;  // the group's exposed-wait counter
  std::string description_;
  double timeout_s_ = 0.0;
  std::function<void()> on_wait_;
};
/// What every collective returns: the handle to wait() on.
using WorkHandle = std::shared_ptr<Work>;

/// What a group has moved, in bytes, per collective kind: the full
/// (unsharded) buffer for all-gather and reduce-scatter, the tensor for
/// all-reduce and broadcast, the input for all-to-all. Padding is included. Also the time callers
/// spent blocked in Work::wait (communication the compute did not hide).
struct CommStats {
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> bytes{};  ///< by CollectiveKind
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> calls{};  ///< collectives issued, by kind
  double wait_seconds = 0.0;  ///< time blocked in Work::wait (exposed communication)
  /// Bytes over every kind.
  int64_t total_bytes() const;
};

/// A group of ranks and the collectives FSDP needs, each asynchronous
/// (wait on the WorkHandle it returns). Every rank of the group must issue
/// the same collectives in the same order. Made by MpiEnvironment::world(),
/// make_nccl_process_group, make_local_process_group and split().
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  /// This process's rank in the group (0 ... size() - 1).
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;

  /// output (size() * n elements) = concatenation of every rank's input (n
  /// elements), in rank order. Both contiguous, same dtype.
  virtual WorkHandle all_gather(torch::Tensor output, torch::Tensor input) = 0;
  /// output (n elements) = slice rank() of the element-wise reduction of every
  /// rank's input (size() * n elements).
  virtual WorkHandle reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op) = 0;
  /// tensor = the element-wise reduction of every rank's tensor, in place.
  virtual WorkHandle all_reduce(torch::Tensor tensor, ReduceOp op) = 0;
  /// output (n elements) = every rank's block `rank()` of its input, in rank
  /// order: the input is size() blocks of n / size() elements, block j goes
  /// to rank j (MPI_Alltoall, torch's all_to_all_single with equal splits).
  /// Both contiguous, same dtype and size, a multiple of size().
  virtual WorkHandle all_to_all(torch::Tensor output, torch::Tensor input) = 0;
  /// tensor = rank `root`'s tensor, in place on every rank.
  virtual WorkHandle broadcast(torch::Tensor tensor, int root) = 0;
  /// Done once every rank has called it.
  virtual WorkHandle barrier() = 0;
  /// Collective over this group: ranks with the same color form a new group,
  /// ordered by key (then by rank in this group).
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;
  /// Collective: the ranks of this group that share memory with this one (a
  /// node), ordered by rank.
  virtual std::shared_ptr<ProcessGroup> split_shared_memory() = 0;

  /// The bytes and calls so far, and the time the callers' waits were
  /// exposed (a device group measures it on the device, with events). On a
  /// device the host waits here until the device has passed the waits
  /// measured so far: fsdp::TrainStep asks once a step, just before it
  /// reads the step's loss, which waits for all of the step's work anyway.
  virtual CommStats stats() const;
  /// Zeroes the bytes, calls and wait time.
  virtual void reset_stats();

  /// The stream this group's all-gathers run on, where it has one of its own
  /// (NCCL, a group of one on a device); std::nullopt for host groups. A caller that
  /// makes it current before all_gather, and itself orders it after whatever
  /// the gather reads and overwrites, spares the gather its wait for all the
  /// compute queued so far (FSDP2's forward order).
  virtual std::optional<c10::Stream> gather_stream() const { return std::nullopt; }

  /// How long wait() waits for a collective before it gives up (seconds).
  /// Groups made by split() inherit it. Default: FSDP_COLLECTIVE_TIMEOUT from
  /// the environment, else 600 s.
  void set_timeout(double seconds);
  /// The timeout set_timeout() set (seconds).
  double timeout() const { return timeout_s_.load(); }

 protected:
  std::atomic<double> timeout_s_{default_timeout()};  ///< timeout(): atomic, read by watchdog threads
  /// FSDP_COLLECTIVE_TIMEOUT from the environment, else 600 s.
  static double default_timeout();
  /// Counts one collective of `kind` that moves `bytes` (a backend calls it per collective).
  void count(CollectiveKind kind, int64_t bytes);
  /// Mutable: a device group adds the waits its events measured when asked.
  mutable std::atomic<double> wait_seconds_{0.0};

 private:
  std::array<std::atomic<int64_t>, static_cast<size_t>(CollectiveKind::kCount)> bytes_{};
  std::array<std::atomic<int64_t>, static_cast<size_t>(CollectiveKind::kCount)> calls_{};
};
/// How groups are passed and kept: shared by the model, its units and the caller.
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

/// Collective: every rank passes its own error ("" for none); if any rank
/// failed, every rank throws the same message, the first failing rank's
/// ("rank R: ..." where some ranks did not fail), so that whichever rank ends
/// the job prints the cause. For work that only some ranks do (rank 0
/// writing a file), so that the others do not wait forever in the next
/// collective.
void throw_if_any_rank_failed(const ProcessGroupPtr& group, const std::string& error);

/// NCCL (the CUDA configuration): a group of the same ranks as `bootstrap`,
/// one GPU per rank (`device`, a CUDA device). The NCCL unique id travels
/// over `bootstrap` (an MPI group); split() splits `bootstrap` and makes a new
/// communicator (a group of one for a split of one rank). Every collective
/// waits for the work the caller's current stream has queued (none when that
/// stream is the group's own: gather_stream()), runs on the group's own
/// stream (all-gathers and broadcasts on one, reductions on another), and
/// holds its tensors until wait(), which makes the caller's current stream
/// wait for it. Both streams share one communicator, which runs its
/// operations in the order they are issued (NVIDIA/nccl#574): FSDP issues a
/// unit's prefetched gather before the reduction after it, so that order is
/// the one wanted, and a second communicator would double NCCL's buffers for
/// no overlap the links could give (they carry both either way).
///
/// The communicator is made non-blocking (ncclCommInitRankConfig, blocking =
/// 0): its set-up and every call wait at most the group's timeout, and a
/// failure is thrown with NCCL's text instead of hanging. A watchdog thread
/// polls the communicator's asynchronous error (ncclCommGetAsyncError) and
/// the collectives in flight; an error, or a collective past the timeout,
/// aborts the communicator (ncclCommAbort) and ends the job with the text.
/// Throws in builds without CUDA, and when two ranks name the same GPU (NCCL
/// refuses that: use the MPI group, which stages device tensors through host
/// memory). CPU tensors go over `bootstrap`, so code that exchanges small
/// host tensors works unchanged.
ProcessGroupPtr make_nccl_process_group(const ProcessGroupPtr& bootstrap, c10::Device device);

/// A group of one rank, on `device` (any: the CPU, a GPU): every collective
/// is a copy (or nothing) on the caller's current stream; no transport is
/// touched. What choose_device gives a one-rank device run, so that a run of
/// one GPU needs no NCCL. On a device it has a gather stream as NCCL's group
/// has, and an all-gather's wait() orders the waiter's stream after the copy
/// (so the engine's gather order runs on one GPU too); elsewhere a
/// collective is complete when it returns. Bytes and calls are counted as a
/// one-rank MPI group counts them.
ProcessGroupPtr make_local_process_group(c10::Device device);
/// Whether this build has the CUDA configuration (FSDP_CUDA).
bool cuda_build();
/// How many GPUs this process sees (0 without CUDA).
int cuda_device_count();

/// MPI: initialize once per process (MPI_THREAD_MULTIPLE), finalize at exit.
/// world() is the group of all ranks.
class MpiEnvironment {
 public:
  /// Initializes MPI with main()'s arguments.
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;
  /// The group of all ranks (MPI_COMM_WORLD).
  ProcessGroupPtr world() const { return world_; }
  /// Ends every rank of the job (for errors after which ranks may disagree on
  /// what comes next, and would otherwise wait for each other forever).
  [[noreturn]] static void abort(int exit_code);
  /// Prints `message` (one line, written at once so ranks' messages never
  /// interleave) and ends the job as abort() does. Ranks of one host that
  /// fail with the same message print it once between them.
  [[noreturn]] static void abort_with_message(const std::string& message, int exit_code = 1);

 private:
  ProcessGroupPtr world_;
};

}  // namespace fsdp
