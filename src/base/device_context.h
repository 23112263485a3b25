#pragma once
// The model's device context (FSDP2's FSDPCommContext): where the units
// compute, and the streams and events their shards cross on. One per model,
// owned by its FsdpState. Device-specific decisions are asked here (or of a
// tensor through in_host_memory) rather than through is_cpu() checks spread
// over the engine. Not installed.

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <optional>

namespace at {
class Tensor;
}

namespace fsdp {

// Whether `tensor` lives in host memory (the CPU's), where the engine's own
// CPU loops can read it; otherwise it is on a device and its work is queued.
bool in_host_memory(const at::Tensor& tensor);

// Whether `device` is the host (the CPU).
bool is_host_device(const c10::Device& device);

class DeviceContext {
 public:
  // `copy_stream`: make the stream host-device copies cross on (CPU
  // offload on a GPU); ignored for a CPU device.
  DeviceContext(c10::Device device, bool copy_stream);

  // Where the units compute.
  c10::Device device() const { return device_; }
  // The units compute on the host (no device streams, no device memory figures).
  bool on_host() const { return is_host_device(device_); }
  // Whether the shards cross between host and device on the copy stream.
  bool has_copy_stream() const { return copy_stream_.has_value(); }
  // The copy stream: one per model, so that the copies keep their order,
  // apart from the compute stream, so that they overlap it.
  const c10::Stream& copy_stream() const;
  // The stream current for the units' device (the compute stream).
  c10::Stream compute_stream() const;
  // The copy stream waits (on the device) for the compute stream's work so
  // far: blocks freed there may be reused, and what it produced is ready.
  void copy_stream_waits_for_compute() const;
  // An event recorded on the copy stream now: the copies issued so far.
  c10::Event record_on_copy_stream() const;
  // The host waits for every copy issued so far (nothing without a copy stream).
  void synchronize_copy_stream() const;

 private:
  c10::Device device_;
  std::optional<c10::Stream> copy_stream_;
};

}  // namespace fsdp
