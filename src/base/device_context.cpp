// The model's device context: its device and the copy stream.

#include "base/device_context.h"

#include <ATen/core/Tensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace fsdp {

bool is_host_device(const c10::Device& device) { return device.is_cpu(); }

bool in_host_memory(const at::Tensor& tensor) { return is_host_device(tensor.device()); }

DeviceContext::DeviceContext(c10::Device device, bool copy_stream) : device_(device) {
  if (copy_stream && !is_host_device(device_)) {
    copy_stream_ = c10::impl::getDeviceGuardImpl(device_.type())->getStreamFromGlobalPool(device_);
  }
}

const c10::Stream& DeviceContext::copy_stream() const {
  TORCH_CHECK(copy_stream_, "DeviceContext: the units on ", device_, " have no copy stream (only CPU offload on a ",
              "device makes one)");
  return *copy_stream_;
}

c10::Stream DeviceContext::compute_stream() const {
  return c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
}

void DeviceContext::copy_stream_waits_for_compute() const {
  c10::Event ready(device_.type());
  ready.record(compute_stream());
  ready.block(copy_stream());
}

c10::Event DeviceContext::record_on_copy_stream() const {
  c10::Event copied(device_.type());
  copied.record(copy_stream());
  return copied;
}

void DeviceContext::synchronize_copy_stream() const {
  if (copy_stream_) copy_stream_->synchronize();
}

}  // namespace fsdp
