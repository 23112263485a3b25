// A job in which the last rank never makes a collective the others make:
// the others' watchdog must end the job, naming the call, within the
// timeout. Used by trainer_test.sh's watchdog case.
//   watchdog_probe TIMEOUT_SECONDS

#include <chrono>
#include <iostream>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/error.h"

int main(int argc, char** argv) {
  fsdp::MpiEnvironment mpi(&argc, &argv);
  auto world = mpi.world();
  world->set_timeout(argc > 1 ? std::atof(argv[1]) : 2.0);
  if (world->rank() == world->size() - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // "hangs"
    return 0;
  }
  try {
    torch::Tensor t = torch::ones({4});
    world->all_reduce(t, fsdp::ReduceOp::kSum)->wait();
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << fsdp::error_message(e) << "\n" << std::flush;
    fsdp::MpiEnvironment::abort(1);
  }
  return 0;
}
