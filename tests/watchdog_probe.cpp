// A job in which the last rank never makes a collective the others make:
// the others' watchdog must end the job, naming the call, within the
// timeout. Used by tests/trainer/cases/watchdog.sh.
//   watchdog_probe TIMEOUT_SECONDS [unwind]
// With "unwind", the waiting ranks do not end the job themselves: main
// returns, and destroying the process group (whose collective is stuck
// for good) must end the job instead of hanging the rank.

#include <chrono>
#include <iostream>
#include <string>
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
    if (argc > 2 && std::string(argv[2]) == "unwind") return 1;
    fsdp::MpiEnvironment::abort(1);
  }
  return 0;
}
