#pragma once
#include "fsdp/comm.h"

namespace fsdp::testing {
// The world group of a multi-rank test binary (set up by mpi_gtest_main.cpp).
extern ProcessGroupPtr world_group;
}  // namespace fsdp::testing
