// Preemption: the signal handlers and the collective stop flag.

#include "fsdp/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>

namespace fsdp {
namespace {

volatile std::sig_atomic_t preemption_signal = 0;

extern "C" void on_preemption_signal(int signal) {
  if (preemption_signal != 0) ::_exit(128 + signal);
  preemption_signal = signal;
}

}  // namespace

Preemption::Preemption() {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGUSR1}) ::sigaction(signal, &action, nullptr);
}

bool Preemption::agreed_to_stop(const ProcessGroupPtr& world) const {
  torch::Tensor signalled = torch::tensor({static_cast<int>(preemption_signal != 0)}, torch::kInt);
  world->all_reduce(signalled, ReduceOp::kSum)->wait();
  return signalled.item<int>() > 0;
}

int Preemption::signal_here() const { return preemption_signal; }

}  // namespace fsdp
