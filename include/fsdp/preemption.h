#pragma once
/// \file
/// SIGTERM/SIGUSR1 as a collective stop at step boundaries, and at once
/// before the first step.
///
/// Preemption (Slurm's SIGTERM or `--signal`, Kubernetes' SIGTERM; fsdp-run
/// turns its own SIGTERM into SIGUSR1, which mpirun forwards to every rank):
/// - before stepping starts (while the run loads, plans and shards, which can
///   take minutes, or spins on a bad input), a signal ends the process at
///   once with status_before_stepping(), after removing the files registered
///   with remove_before_stepping(): there is nothing to save yet;
/// - once start_stepping() is called, the first SIGTERM or SIGUSR1 a rank
///   receives is noted, and the ranks agree at the next step boundary to stop
///   (and save); a second signal ends the rank at once (exit status 128 + the
///   signal).
///
/// \code{.cpp}
/// fsdp::Preemption preemption;  // installs the handlers
/// ... load, shard ...
/// preemption.start_stepping();
/// for (...) { train a step; if (preemption.agreed_to_stop(world)) { save; break; } }
/// \endcode

#include <string>

#include "fsdp/comm.h"

namespace fsdp {

/// The process's preemption handlers and the ranks' agreement to stop.
class Preemption {
 public:
  /// Installs the process's handlers of SIGTERM and SIGUSR1 (one object per
  /// process: the handlers are the process's). Before start_stepping(), a
  /// signal ends the process with `status_before_stepping`, printing one line
  /// that begins with `program` on the rank that the environment calls 0.
  explicit Preemption(int status_before_stepping = 76, const std::string& program = "fsdp");
  /// The status a signal before start_stepping() ends the process with.
  void set_status_before_stepping(int status) const;
  /// Removes `path` (a file, or an empty folder) should a signal end the
  /// process before start_stepping(): an output opened early (a log) that
  /// would otherwise be left empty. At most a few paths.
  void remove_before_stepping(const std::string& path) const;
  /// From now on a signal is a stop at the next step boundary (agreed_to_stop).
  void start_stepping() const;
  /// A run that fails before start_stepping() leaves nothing either: removes
  /// the paths registered with remove_before_stepping(), as a signal would.
  /// Nothing once stepping has started (a log of steps is the run's record).
  void failed_before_stepping() const;
  /// Collective over `world`, at a step boundary: whether any rank has been
  /// signalled. Every rank gets the same answer. Starts stepping, if
  /// start_stepping() was not called.
  bool agreed_to_stop(const ProcessGroupPtr& world) const;
  /// The signal this rank received (0: none).
  int signal_here() const;
};

}  // namespace fsdp
