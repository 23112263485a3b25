// ZeRO++'s refusals and host groups: see host_groups.h.
#include "core/host_groups.h"
#include "core/strategy_rules.h"

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>

namespace fsdp {

void check_zero_plus_plus(const FullyShardOptions& options) {
  const ZeroPlusPlus& z = options.zero_plus_plus();
  if (!z.any()) return;
  const ShardingStrategy s = options.strategy();
  TORCH_CHECK(!keeps_params_unsharded(s), "fully_shard: ZeRO++'s options (zero_plus_plus) need a sharded strategy: ",
              fsdp::enum_name(s), " keeps the parameters whole and all-reduces the gradients, with nothing to gather "
              "or reduce-scatter");
  TORCH_CHECK(!z.secondary_partition() || s == ShardingStrategy::kFullShard,
              "fully_shard: secondary_partition (hpZ) needs full_shard, found ", fsdp::enum_name(s), ": ",
              is_hybrid(s) ? "a hybrid strategy already gathers inside the host"
                           : "shard_grad_op keeps the parameters from forward to backward and gathers once",
              "; it keeps the host's slice after forward so that backward's gather stays inside the host");
  TORCH_CHECK(z.gradient_quantization() == Quantization::kNone || !is_hybrid(s),
              "fully_shard: gradient_quantization (qgZ) needs full_shard or shard_grad_op, found ", fsdp::enum_name(s),
              ": a hybrid strategy already reduce-scatters inside the host and all-reduces shards across hosts");
  TORCH_CHECK(z.quantization_block() > 0 && z.quantization_block() % 4 == 0,
              "fully_shard: quantization_block must be a positive multiple of 4 elements (each block's fp32 scale "
              "follows the int8 values, aligned), found ", z.quantization_block());
}

namespace {
int64_t host_name_hash() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  // Non-negative, so that it fits a color too.
  return static_cast<int64_t>(std::hash<std::string>{}(name) & 0x3fffffffffffffffull);
}
}  // namespace

int count_hosts(const ProcessGroupPtr& world, int ranks_per_node) {
  if (ranks_per_node > 0) return std::max(1, world->size() / ranks_per_node);
  torch::Tensor all = torch::empty({world->size()}, torch::kLong);
  world->all_gather(all, torch::tensor({host_name_hash()}, torch::kLong))->wait();
  const auto* a = all.data_ptr<int64_t>();
  return static_cast<int>(std::set<int64_t>(a, a + world->size()).size());
}

HostGroups make_host_groups(const ProcessGroupPtr& world, int ranks_per_node, c10::Device device) {
  const int size = world->size(), rank = world->rank();
  HostGroups g;
  if (ranks_per_node > 0) {
    TORCH_CHECK(size % ranks_per_node == 0, "fully_shard: ", size, " ranks cannot form hosts of ", ranks_per_node,
                " ranks (ranks_per_node must divide the world size)");
    g.host = world->split(rank / ranks_per_node, rank);
  } else {
    g.host = world->split_shared_memory();
  }
  g.cross_host = world->split(g.host->rank(), rank);
  // Every rank's (place in its host, host's index), to check that the hosts
  // are alike and to order the world host-major.
  torch::Tensor mine = torch::tensor({static_cast<int64_t>(g.host->rank()), static_cast<int64_t>(g.cross_host->rank()),
                                      static_cast<int64_t>(g.host->size())}, torch::kLong);
  torch::Tensor all = torch::empty({3 * size}, torch::kLong);
  world->all_gather(all, mine)->wait();
  const auto* a = all.data_ptr<int64_t>();
  const int64_t per_host = g.host->size();
  for (int r = 0; r < size; ++r) {
    TORCH_CHECK(a[3 * r + 2] == per_host, "fully_shard: ZeRO++'s options need the same number of ranks on every "
                "host; rank ", r, "'s host has ", a[3 * r + 2], " ranks, this rank's ", per_host);
  }
  g.hosts = static_cast<int>(size / per_host);
  std::vector<int64_t> order(size, -1);
  for (int r = 0; r < size; ++r) order[a[3 * r] * g.hosts + a[3 * r + 1]] = r;
  g.host_major_ranks = torch::tensor(order, torch::kLong).to(device);
  return g;
}

}  // namespace fsdp
