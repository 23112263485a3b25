// The MPI backend. Every MPI call of a group runs on that group's own
// communication thread (the CPU analogue of a CUDA stream): callers enqueue a
// collective and get a Work back, so compute on the caller's thread overlaps
// the transfer. Before each collective the ranks exchange a small signature
// (kind, dtype, element count, root, sequence number); a mismatch fails on
// every rank with a message naming each rank's call, instead of hanging or
// reducing garbage.

#include <mpi.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <chrono>
#include <csignal>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/all_to_all_check.h"
#include "fsdp/comm.h"
#include "fsdp/trace.h"
#include "base/trace_events.h"

namespace fsdp {
namespace {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  TORCH_CHECK(false, "MPI error in ", what, ": ", std::string(text, length));
}

// MPI has no 16-bit float types: move them as opaque 2-byte elements and sum
// them with our own operations (in fp32, rounded back once per pair).
struct HalfTypes {
  MPI_Datatype bf16, fp16;
  MPI_Op bf16_sum, fp16_sum;
};

template <typename T>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

const HalfTypes& half_types() {
  static HalfTypes types = [] {
    HalfTypes t;
    MPI_Type_contiguous(2, MPI_BYTE, &t.bf16);
    MPI_Type_commit(&t.bf16);
    MPI_Type_contiguous(2, MPI_BYTE, &t.fp16);
    MPI_Type_commit(&t.fp16);
    MPI_Op_create(&sum_16bit<c10::BFloat16>, /*commute=*/1, &t.bf16_sum);
    MPI_Op_create(&sum_16bit<c10::Half>, /*commute=*/1, &t.fp16_sum);
    return t;
  }();
  return types;
}

MPI_Datatype mpi_type(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT32_T;
    case torch::kLong: return MPI_INT64_T;
    case torch::kByte: return MPI_UINT8_T;
    case torch::kChar: return MPI_INT8_T;
    case torch::kBFloat16: return half_types().bf16;
    case torch::kHalf: return half_types().fp16;
    default: TORCH_CHECK(false, "collectives support float32/64, bfloat16, float16, int8/32/64 and uint8 tensors, got ", type);
  }
}

MPI_Op mpi_sum(torch::ScalarType type) {
  if (type == torch::kBFloat16) return half_types().bf16_sum;
  if (type == torch::kHalf) return half_types().fp16_sum;
  return MPI_SUM;
}

// What every rank must agree on for one collective call.
struct Signature {
  int32_t kind;  // CollectiveKind, or -1 barrier, -2 split
  int32_t dtype;
  int64_t count;  // elements per rank (all-gather input, reduce-scatter output)
  int64_t sequence;
  int32_t root;
  int32_t op;
};

std::string describe(const Signature& s) {
  std::ostringstream out;
  if (s.kind == -1) return "barrier";
  if (s.kind == -2) return "split";
  out << fsdp::enum_name(static_cast<CollectiveKind>(s.kind)) << "(" << static_cast<torch::ScalarType>(s.dtype) << ", "
      << s.count << " elements per rank";
  if (s.kind == static_cast<int>(CollectiveKind::kBroadcast)) out << ", root " << s.root;
  if (s.kind == static_cast<int>(CollectiveKind::kReduceScatter) || s.kind == static_cast<int>(CollectiveKind::kAllReduce))
    out << (s.op == static_cast<int>(ReduceOp::kAvg) ? ", avg" : ", sum");
  out << ")";
  return out.str();
}

bool same_call(const Signature& a, const Signature& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count && a.sequence == b.sequence && a.root == b.root &&
         a.op == b.op;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  explicit MpiProcessGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    worker_exited_ = worker_exit_.get_future();
    worker_ = std::thread([this] {
      run_worker();
      worker_exit_.set_value();
    });
  }

  ~MpiProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    // A collective that never completes (a rank died, hangs, or skipped the
    // call) holds the worker forever, and MPI cannot cancel it: joining
    // would hang this rank instead of ending the job. After the timeout the
    // job is ended, as the watchdog would have (this happens when an error
    // unwinds through the group's owner before anyone aborted the job).
    if (worker_exited_.wait_for(std::chrono::duration<double>(timeout())) != std::future_status::ready) {
      std::string running;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running = running_;
      }
      MpiEnvironment::abort_with_message("collective watchdog: a process group was destroyed while its " + running +
                                         " had not completed after " + c10::str(timeout()) +
                                         " s; a rank has died, hangs, or did not make this call. Ending the job.");
    }
    worker_.join();
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  WorkHandle all_gather(torch::Tensor output, torch::Tensor input) override {
    if (on_device(output, input, "all_gather")) {
      torch::Tensor host_output = torch::empty(output.sizes(), output.options().device(torch::kCPU));
      return copy_back_on_wait(all_gather(host_output, input.to(torch::kCPU)), output, host_output);
    }
    check_buffer(output, "all_gather output");
    check_buffer(input, "all_gather input");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_gather: output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(output.numel() == input.numel() * size_, "all_gather: output must hold group size (", size_,
                ") x input elements (", input.numel(), ") = ", input.numel() * size_, ", found ", output.numel());
    count(CollectiveKind::kAllGather, output.nbytes());
    Signature sig = signature(static_cast<int>(CollectiveKind::kAllGather), input, input.numel());
    // An input that is this rank's slice of the output is gathered in place.
    const bool in_place = input.data_ptr() == static_cast<char*>(output.data_ptr()) + rank_ * input.nbytes();
    return enqueue(sig, [this, output, input, in_place] {
      MPI_Datatype type = mpi_type(input.scalar_type());
      check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : input.data_ptr(), input.numel(), type, output.data_ptr(),
                              input.numel(), type, comm_),
                "MPI_Allgather");
    });
  }

  WorkHandle reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op) override {
    if (on_device(output, input, "reduce_scatter")) {
      torch::Tensor host_output = torch::empty(output.sizes(), output.options().device(torch::kCPU));
      return copy_back_on_wait(reduce_scatter(host_output, input.to(torch::kCPU), op), output, host_output);
    }
    check_buffer(output, "reduce_scatter output");
    check_buffer(input, "reduce_scatter input");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "reduce_scatter: output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(input.numel() == output.numel() * size_, "reduce_scatter: input must hold group size (", size_,
                ") x output elements (", output.numel(), ") = ", output.numel() * size_, ", found ", input.numel());
    check_reducible(input, op);
    count(CollectiveKind::kReduceScatter, input.nbytes());
    Signature sig = signature(static_cast<int>(CollectiveKind::kReduceScatter), output, output.numel(), 0, op);
    return enqueue(sig, [this, output, input, op] {
      auto type = input.scalar_type();
      check_mpi(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(), output.numel(), mpi_type(type),
                                         mpi_sum(type), comm_),
                "MPI_Reduce_scatter_block");
      if (op == ReduceOp::kAvg) output.div_(size_);
    });
  }

  WorkHandle all_reduce(torch::Tensor tensor, ReduceOp op) override {
    if (on_device(tensor, tensor, "all_reduce")) {
      torch::Tensor host = tensor.to(torch::kCPU);
      return copy_back_on_wait(all_reduce(host, op), tensor, host);
    }
    check_buffer(tensor, "all_reduce tensor");
    check_reducible(tensor, op);
    count(CollectiveKind::kAllReduce, tensor.nbytes());
    Signature sig = signature(static_cast<int>(CollectiveKind::kAllReduce), tensor, tensor.numel(), 0, op);
    return enqueue(sig, [this, tensor, op] {
      auto type = tensor.scalar_type();
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), tensor.numel(), mpi_type(type), mpi_sum(type), comm_),
                "MPI_Allreduce");
      if (op == ReduceOp::kAvg) tensor.div_(size_);
    });
  }

  WorkHandle all_to_all(torch::Tensor output, torch::Tensor input) override {
    if (on_device(output, input, "all_to_all")) {
      torch::Tensor host_output = torch::empty(output.sizes(), output.options().device(torch::kCPU));
      return copy_back_on_wait(all_to_all(host_output, input.to(torch::kCPU)), output, host_output);
    }
    check_buffer(output, "all_to_all output");
    check_buffer(input, "all_to_all input");
    check_all_to_all(output, input, size_);
    count(CollectiveKind::kAllToAll, input.nbytes());
    const int64_t block = input.numel() / size_;
    Signature sig = signature(static_cast<int>(CollectiveKind::kAllToAll), input, block);
    return enqueue(sig, [this, output, input, block] {
      MPI_Datatype type = mpi_type(input.scalar_type());
      check_mpi(MPI_Alltoall(input.data_ptr(), block, type, output.data_ptr(), block, type, comm_), "MPI_Alltoall");
    });
  }

  WorkHandle broadcast(torch::Tensor tensor, int root) override {
    if (on_device(tensor, tensor, "broadcast")) {
      torch::Tensor host = tensor.to(torch::kCPU);
      return copy_back_on_wait(broadcast(host, root), tensor, host);
    }
    check_buffer(tensor, "broadcast tensor");
    TORCH_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of size ", size_);
    count(CollectiveKind::kBroadcast, tensor.nbytes());
    Signature sig = signature(static_cast<int>(CollectiveKind::kBroadcast), tensor, tensor.numel(), root);
    return enqueue(sig, [this, tensor, root] {
      check_mpi(MPI_Bcast(tensor.data_ptr(), tensor.numel(), mpi_type(tensor.scalar_type()), root, comm_),
                "MPI_Bcast");
    });
  }

  WorkHandle barrier() override {
    Signature sig{-1, 0, 0, 0, 0, 0};
    return enqueue(sig, [this] { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); });
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    TORCH_CHECK(color >= 0, "split: color must be non-negative, got ", color);
    return subgroup([this, color, key](MPI_Comm* out) {
      check_mpi(MPI_Comm_split(comm_, color, key, out), "MPI_Comm_split");
    });
  }

  std::shared_ptr<ProcessGroup> split_shared_memory() override {
    return subgroup([this](MPI_Comm* out) {
      check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, out), "MPI_Comm_split_type");
    });
  }

 private:
  struct Task {
    Signature signature;
    std::function<void()> body;
    std::promise<void> done;
  };

  // Runs a communicator-splitting call on the communication thread (it is a
  // collective like any other) and wraps the result, inheriting the timeout.
  std::shared_ptr<ProcessGroup> subgroup(std::function<void(MPI_Comm*)> make_comm) {
    auto new_comm = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    Signature sig{-2, 0, 0, 0, 0, 0};
    enqueue(sig, [make_comm = std::move(make_comm), new_comm] { make_comm(new_comm.get()); })->wait();
    auto group = std::make_shared<MpiProcessGroup>(*new_comm);
    group->set_timeout(timeout());
    return group;
  }

  // Device tensors (several ranks sharing one GPU, which NCCL refuses)
  // travel through host memory: copied to the host when the collective is
  // issued (synchronously, after the work queued on the current stream),
  // and back in wait(), in the waiting thread's stream order. For
  // correctness on one GPU, not for speed.
  static bool on_device(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
    TORCH_CHECK(a.defined() && b.defined(), what, ": a tensor is undefined");
    TORCH_CHECK(a.device() == b.device(), what, ": both tensors must be on one device, found ", a.device(), " and ",
                b.device());
    return !a.device().is_cpu();
  }

  static WorkHandle copy_back_on_wait(WorkHandle work, torch::Tensor device, torch::Tensor host) {
    work->then_on_wait([device, host] { device.copy_(host); });
    return work;
  }

  static void check_buffer(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.defined(), what, " is undefined");
    TORCH_CHECK(t.device().is_cpu(), "the MPI backend moves CPU tensors (device tensors are staged); ", what, " is on ",
                t.device());
    TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
    TORCH_CHECK(t.numel() <= std::numeric_limits<int>::max(), what, " has ", t.numel(),
                " elements; MPI counts are ints, so at most ", std::numeric_limits<int>::max(), " per call");
  }

  static void check_reducible(const torch::Tensor& t, ReduceOp op) {
    TORCH_CHECK(op != ReduceOp::kAvg || t.is_floating_point(), "an average needs a floating-point tensor, got ",
                t.scalar_type());
  }

  Signature signature(int kind, const torch::Tensor& t, int64_t count, int root = 0, ReduceOp op = ReduceOp::kSum) {
    return Signature{kind, static_cast<int32_t>(t.scalar_type()), count, 0, root, static_cast<int32_t>(op)};
  }

  WorkHandle enqueue(Signature sig, std::function<void()> body) {
    Task task{sig, std::move(body), {}};
    std::shared_future<void> done = task.done.get_future().share();
    int64_t sequence = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sequence = task.signature.sequence = next_sequence_++;
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    std::string description = describe(sig) + " (call #" + std::to_string(sequence) + " of a group of " +
                              std::to_string(size_) + " ranks, this rank " + std::to_string(rank_) + ")";
    return std::make_shared<Work>(std::move(done), &wait_seconds_, std::move(description), timeout());
  }

  void run_worker() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything issued has run
        task = std::move(queue_.front());
        queue_.pop_front();
        running_ = describe(task.signature) + " (call #" + std::to_string(task.signature.sequence) + ")";
      }
      // The body's captured tensors are released before completion is
      // signalled: a caller that saw wait() return must also see their memory
      // freed (memory accounting depends on it).
      std::exception_ptr error;
      try {
        check_signatures(task.signature);
        const int kind = task.signature.kind;
        trace::Span span(kind < 0 ? describe(task.signature) : fsdp::enum_name(static_cast<CollectiveKind>(kind)),
                         "comm", trace::enabled() ? describe(task.signature) : "");
        task.body();
      } catch (...) {
        error = std::current_exception();
      }
      task.body = nullptr;
      if (error) {
        task.done.set_exception(error);
      } else {
        task.done.set_value();
      }
    }
  }

  void check_signatures(const Signature& mine) {
    std::vector<Signature> all(size_);
    check_mpi(MPI_Allgather(&mine, sizeof(Signature), MPI_BYTE, all.data(), sizeof(Signature), MPI_BYTE, comm_),
              "MPI_Allgather (collective signature check)");
    bool match = true;
    for (const auto& s : all) match = match && same_call(s, all[0]);
    if (match) return;
    std::ostringstream msg;
    msg << "collective call #" << mine.sequence << " does not match across the " << size_ << " ranks of the group:";
    for (int r = 0; r < size_; ++r) msg << "\n  rank " << r << ": " << describe(all[r]) << " (call #" << all[r].sequence << ")";
    TORCH_CHECK(false, msg.str());
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  int64_t next_sequence_ = 0;
  bool stopping_ = false;
  std::string running_;  // the collective the worker took last (for the destructor's message)
  std::promise<void> worker_exit_;
  std::future<void> worker_exited_;
};

}  // namespace

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  TORCH_CHECK(!initialized, "MPI is already initialized: create one MpiEnvironment per process");
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  TORCH_CHECK(provided >= MPI_THREAD_MULTIPLE,
              "this MPI library does not grant MPI_THREAD_MULTIPLE (needed for one communication thread per group); "
              "granted level ",
              provided);
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  world_ = std::make_shared<MpiProcessGroup>(world);
}

MpiEnvironment::~MpiEnvironment() {
  world_.reset();
  MPI_Finalize();
}

void MpiEnvironment::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this tells the compiler so
}

void MpiEnvironment::abort_with_message(const std::string& message, int exit_code) {
  // The message is the job's last line: what this rank printed before is
  // flushed, and mpirun, which forwards each rank's stdout and stderr through
  // pipes of their own, is given a moment to pass it on first (a progress
  // line once came after the error it preceded). Every rank waits alike, so
  // the first to end the job still prints. Meanwhile the launcher's SIGTERM,
  // sent when another rank's abort ends the job first, ends this rank
  // quietly: the preemption's handler (fsdp::Preemption) would print that
  // the run was preempted after the error.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  std::fflush(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The first rank on this host to bind an abstract socket named after the
  // message (and the job's local launcher, the ranks' common parent) prints
  // it; the others find the name taken. The name vanishes with the process.
  const uint64_t hash = std::hash<std::string>()(message);
  const std::string name = "fsdp-error-" + std::to_string(::getppid()) + "-" + std::to_string(hash);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), std::min(name.size(), sizeof(address.sun_path) - 2));
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const bool first = fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0;
  if (first) {
    const std::string line = message + (message.empty() || message.back() != '\n' ? "\n" : "");
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  }
  abort(exit_code);
}

}  // namespace fsdp
