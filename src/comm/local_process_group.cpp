// A group of one rank: collectives as copies on the caller's current stream.
// A run on one GPU then needs no NCCL at all (the transport most likely to
// fail on a new machine), and its numbers are a one-rank MPI group's: a
// gather of one shard is the shard, a sum or average of one is the value.
// On a device it names a gather stream of its own, as NCCL's group does, so
// that the engine's gather order (src/core/gather_order.h) runs on a one-GPU
// machine too: a gather's copy issued there is waited for as an NCCL
// gather is, by the waiter's stream on an event.

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <future>
#include <optional>

#include "comm/all_to_all_check.h"
#include "fsdp/comm.h"

namespace fsdp {
namespace {

c10::Stream current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// A device copy issued on some stream: wait() makes the waiter's current
// stream wait for it, and the tensors live until then (NcclWork's rule).
class DeviceCopyWork final : public Work {
 public:
  DeviceCopyWork(c10::Device device, std::vector<torch::Tensor> buffers)
      : device_(device), done_(device.type()), buffers_(std::move(buffers)) {
    done_.record(current_stream(device_));
  }
  // As NcclWork: one dropped unwaited (an error between issue and wait)
  // orders the current stream after the copy before its buffers go back to
  // a caching allocator; any error is the one already unwinding.
  ~DeviceCopyWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (waited_) return;
    done_.block(current_stream(device_));
    buffers_.clear();
    waited_ = true;
    run_on_wait_action();
  }
  bool is_completed() const override { return done_.query(); }

 private:
  c10::Device device_;
  c10::Event done_;
  std::vector<torch::Tensor> buffers_;
  bool waited_ = false;
};

class LocalProcessGroup final : public ProcessGroup {
 public:
  explicit LocalProcessGroup(c10::Device device) : device_(device) {
    if (!device_.is_cpu()) {
      gather_stream_ = c10::impl::getDeviceGuardImpl(device_.type())->getStreamFromGlobalPool(device_);
    }
  }

  std::optional<c10::Stream> gather_stream() const override { return gather_stream_; }

  int rank() const override { return 0; }
  int size() const override { return 1; }

  WorkHandle all_gather(torch::Tensor output, torch::Tensor input) override {
    check_pair(output, input, "all_gather");
    count(CollectiveKind::kAllGather, output.nbytes());
    copy(output, input);
    if (!device_.is_cpu() && !output.device().is_cpu()) {
      return std::make_shared<DeviceCopyWork>(device_, std::vector<torch::Tensor>{output, input});
    }
    return done("all_gather");
  }

  WorkHandle reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op) override {
    check_pair(output, input, "reduce_scatter");
    TORCH_CHECK(op != ReduceOp::kAvg || input.is_floating_point(), "an average needs a floating-point tensor, got ",
                input.scalar_type());
    count(CollectiveKind::kReduceScatter, input.nbytes());
    copy(output, input);
    return done("reduce_scatter");
  }

  WorkHandle all_reduce(torch::Tensor tensor, ReduceOp op) override {
    TORCH_CHECK(tensor.defined(), "all_reduce: the tensor is undefined");
    TORCH_CHECK(op != ReduceOp::kAvg || tensor.is_floating_point(), "an average needs a floating-point tensor, got ",
                tensor.scalar_type());
    count(CollectiveKind::kAllReduce, tensor.nbytes());
    return done("all_reduce");
  }

  // One rank's one block goes to itself.
  WorkHandle all_to_all(torch::Tensor output, torch::Tensor input) override {
    check_all_to_all(output, input, 1);
    count(CollectiveKind::kAllToAll, input.nbytes());
    copy(output, input);
    if (!device_.is_cpu() && !output.device().is_cpu()) {
      return std::make_shared<DeviceCopyWork>(device_, std::vector<torch::Tensor>{output, input});
    }
    return done("all_to_all");
  }

  WorkHandle broadcast(torch::Tensor tensor, int root) override {
    TORCH_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
    TORCH_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a group of size 1");
    count(CollectiveKind::kBroadcast, tensor.nbytes());
    return done("broadcast");
  }

  // Nothing to meet but this rank's own device work: done when it returns,
  // as an NCCL group's barrier is.
  WorkHandle barrier() override {
    if (!device_.is_cpu()) c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_).synchronize();
    return done("barrier");
  }

  std::shared_ptr<ProcessGroup> split(int, int) override { return child(); }
  std::shared_ptr<ProcessGroup> split_shared_memory() override { return child(); }

 private:
  static void check_pair(const torch::Tensor& output, const torch::Tensor& input, const char* what) {
    TORCH_CHECK(output.defined() && input.defined(), what, ": an undefined tensor");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), what, ": output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(output.numel() == input.numel(), what, ": a group of one needs as many output elements as input (",
                input.numel(), "), found ", output.numel());
  }

  // A gather in place (the input a view of the whole output) copies nothing.
  static void copy(torch::Tensor& output, const torch::Tensor& input) {
    if (output.data_ptr() == input.data_ptr()) return;
    torch::NoGradGuard no_grad;
    output.view(-1).copy_(input.reshape(-1));
  }

  WorkHandle done(const char* what) {
    std::promise<void> finished;
    finished.set_value();
    return std::make_shared<Work>(finished.get_future().share(), &wait_seconds_,
                                  std::string(what) + " (a group of one rank)", timeout());
  }

  std::shared_ptr<ProcessGroup> child() const {
    auto group = std::make_shared<LocalProcessGroup>(device_);
    group->set_timeout(timeout());
    return group;
  }

  c10::Device device_;
  std::optional<c10::Stream> gather_stream_;  // a device's: where ordered gathers copy
};

}  // namespace

ProcessGroupPtr make_local_process_group(c10::Device device) { return std::make_shared<LocalProcessGroup>(device); }

}  // namespace fsdp
