#pragma once
// The engine's own (not installed): ZeRO++'s options
// (FullyShardOptions::zero_plus_plus), what they refuse, and the groups of
// hosts they communicate over.

#include <torch/types.h>

#include "fsdp/comm.h"
#include "fsdp/options.h"

namespace fsdp {

// Throws, saying why, for a ZeRO++ option that cannot help with these
// options (the strategy, the block size).
void check_zero_plus_plus(const FullyShardOptions& options);

// How many hosts the ranks of `world` are on: world / ranks_per_node when
// given (> 0), else the number of distinct host names. Collective.
int count_hosts(const ProcessGroupPtr& world, int ranks_per_node);

struct HostGroups {
  ProcessGroupPtr host;        // the ranks of this rank's host, by world rank
  ProcessGroupPtr cross_host;  // the ranks at this rank's place in every host, by world rank
  int hosts = 1;
  // World ranks in host-major order: position l * hosts + j holds the rank
  // at place l of host j (host j: rank j of cross_host). Long, on `device`.
  torch::Tensor host_major_ranks;
};
// Collective over `world`: a host is ranks_per_node consecutive ranks (>
// 0), else the ranks that share memory with this one (MPI's view). Every
// host must have as many ranks.
HostGroups make_host_groups(const ProcessGroupPtr& world, int ranks_per_node, c10::Device device);

}  // namespace fsdp
