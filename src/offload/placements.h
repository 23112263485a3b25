#pragma once
// The choice of a model's placement (FullyShardOptions::offload: memory, OffloadPolicy::cpu or ::nvme):
// what FsdpState's constructor hands the engine (core's PlacementChoice).
// Not installed.

#include <memory>

#include "core/shard_offload.h"
#include "fsdp/options.h"

namespace fsdp::offload {

// Refuses, naming the setting, what the CPU and disk offloads cannot do
// with these options on `device` (before fully_shard touches a parameter).
void check_offload_options(const FullyShardOptions& options, c10::Device device);
// The placement fully_shard's options ask for (memory, CPU or disk), once they passed check_offload_options.
std::unique_ptr<ShardOffload> make_shard_offload(const FullyShardOptions& options, const DeviceContext& context);

}  // namespace fsdp::offload
