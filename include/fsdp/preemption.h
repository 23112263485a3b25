#pragma once
/// \file
/// SIGTERM/SIGUSR1 as a collective stop at step boundaries.
///
/// Preemption (Slurm's SIGTERM or `--signal`, Kubernetes' SIGTERM; fsdp-run
/// turns its own SIGTERM into SIGUSR1, which mpirun forwards to every rank):
/// the first SIGTERM or SIGUSR1 a rank receives is noted, and the ranks agree
/// at the next step boundary to stop (and save); a second signal ends the
/// rank at once (exit status 128 + the signal).
///
/// \code{.cpp}
/// fsdp::Preemption preemption;  // installs the handlers
/// for (...) { train a step; if (preemption.agreed_to_stop(world)) { save; break; } }
/// \endcode

#include "fsdp/comm.h"

namespace fsdp {

/// The process's preemption handlers and the ranks' agreement to stop.
class Preemption {
 public:
  /// Installs the process's handlers of SIGTERM and SIGUSR1 (one object per
  /// process: the handlers are the process's).
  Preemption();
  /// Collective over `world`, at a step boundary: whether any rank has been
  /// signalled. Every rank gets the same answer.
  bool agreed_to_stop(const ProcessGroupPtr& world) const;
  /// The signal this rank received (0: none).
  int signal_here() const;
};

}  // namespace fsdp
