#pragma once
/// \file
/// Where a rank computes and over which collectives, and the check that the
/// job's world is the one the scheduler started.

#include <string>

#include "fsdp/comm.h"

namespace fsdp {

/// The collective engine of a run.
enum class CollectiveBackend {
  kAuto,  ///< NCCL where every rank of a host has a GPU of its own, else MPI (one rank: local)
  kMpi,   ///< MPI (device tensors staged through host memory)
  kNccl,  ///< NCCL: a GPU per rank (one rank: local, which needs no NCCL)
};

/// What choose_device decided.
struct DeviceChoice {
  c10::Device device = c10::Device(c10::kCPU);  ///< where this rank's units compute
  std::string backend = "mpi";                  ///< "mpi", "nccl" or "local" (one GPU rank), as resolved
  ProcessGroupPtr group;                        ///< what to shard over: `world`, or NCCL over it
};

/// Collective over `world` for CUDA. On the CPU: the CPU and `world` itself
/// (kNccl is refused). On CUDA: this rank's GPU is its rank among the ranks
/// of its host, modulo the GPUs it sees (several ranks share one where there
/// are fewer), made the current device; NCCL as `backend` says, except that
/// a world of one gets make_local_process_group (no NCCL). Throws when
/// no GPU is visible, or kNccl is asked for with fewer GPUs than ranks.
DeviceChoice choose_device(c10::DeviceType device, CollectiveBackend backend, const ProcessGroupPtr& world);

/// A scheduler that started several tasks which MPI sees as worlds of one
/// each (OpenMPI without PMIx under srun) would have every task train alone,
/// silently: with a world of 1, throws when SLURM_STEP_NUM_TASKS, SLURM_NTASKS
/// or PMI_SIZE say more tasks were started (mpirun's own ranks,
/// OMPI_COMM_WORLD_SIZE, are not that case).
void check_scheduler_world(int world_size);

}  // namespace fsdp
