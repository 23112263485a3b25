// Preemption: the signal handlers and the collective stop flag.

#include "fsdp/preemption.h"

#include "core/preemption_test_hook.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>

namespace fsdp {
namespace {

volatile std::sig_atomic_t preemption_signal = 0;
volatile std::sig_atomic_t stepping = 0;
volatile std::sig_atomic_t status_before_stepping = 76;
// What the handler may touch before stepping starts: fixed buffers, filled
// before the handler can read them (async-signal-safe: no allocation there).
constexpr int kMaxRemoved = 4;
char removed[kMaxRemoved][4096];
volatile std::sig_atomic_t removed_count = 0;
char early_line[256];
bool prints_early_line = true;

void remove_early_outputs() {
  for (int i = 0; i < removed_count; ++i) {
    if (::unlink(removed[i]) != 0) ::rmdir(removed[i]);
  }
}

void end_before_stepping() {
  remove_early_outputs();
  if (prints_early_line) {
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, early_line, std::strlen(early_line));
  }
  ::_exit(status_before_stepping);
}

extern "C" void on_preemption_signal(int signal) {
  if (!stepping) end_before_stepping();
  if (preemption_signal != 0) ::_exit(128 + signal);
  preemption_signal = signal;
}

// This process's rank as the launcher's environment gives it (Open MPI,
// MPICH's PMI, Slurm), before MPI is asked: 0 where none says.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

}  // namespace

Preemption::Preemption(int status, const std::string& program) {
  prints_early_line = launcher_rank() == 0;
  std::snprintf(early_line, sizeof(early_line), "%s: preempted (SIGTERM or SIGUSR1) before the first step: stopped "
                "at once, nothing written\n", program.c_str());
  set_status_before_stepping(status);
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGUSR1}) ::sigaction(signal, &action, nullptr);
}

void Preemption::set_status_before_stepping(int status) const { status_before_stepping = status; }

void Preemption::remove_before_stepping(const std::string& path) const {
  TORCH_CHECK(removed_count < kMaxRemoved && path.size() < sizeof(removed[0]),
              "Preemption::remove_before_stepping: at most ", kMaxRemoved, " paths of under ", sizeof(removed[0]),
              " bytes, got '", path, "'");
  std::memcpy(removed[removed_count], path.c_str(), path.size() + 1);
  removed_count = removed_count + 1;  // after the path is whole: the handler reads only complete ones
}

void Preemption::start_stepping() const { stepping = 1; }

void Preemption::failed_before_stepping() const {
  if (!stepping) remove_early_outputs();
}

bool Preemption::agreed_to_stop(const ProcessGroupPtr& world) const {
  stepping = 1;  // a loop that never said start_stepping() is stepping by its first boundary
  torch::Tensor signalled = torch::tensor({static_cast<int>(preemption_signal != 0)}, torch::kInt);
  world->all_reduce(signalled, ReduceOp::kSum)->wait();
  return signalled.item<int>() > 0;
}

int Preemption::signal_here() const { return preemption_signal; }

}  // namespace fsdp

namespace fsdp::detail {

void maybe_signal_in_setup_for_test(int rank) {
  const char* spec = std::getenv("FSDP_TEST_SIGNAL_IN_SETUP");
  if (spec && std::atoi(spec) == rank) std::raise(SIGTERM);
}

}  // namespace fsdp::detail
