#pragma once
// The choice of a model's placement (memory, cpu_offload, nvme_offload):
// what FsdpState's constructor hands the engine (core's PlacementChoice).
// Not installed.

#include <memory>

#include "core/shard_offload.h"
#include "fsdp/options.h"

namespace fsdp::offload {

// Refuses, naming the setting, what cpu_offload and nvme_offload cannot do
// with these options on `device` (before fully_shard touches a parameter).
void check_offload_options(const FullyShardOptions& options, c10::Device device);
// The placement fully_shard's options ask for (memory, cpu_offload or
// nvme_offload), once they passed check_offload_options.
std::unique_ptr<ShardOffload> make_shard_offload(const FullyShardOptions& options, const DeviceContext& context);

}  // namespace fsdp::offload
