// main() for the single-process GoogleTest binary (unit_tests): every
// allocation counted from the start, so the allocator's tests and the
// tests that measure memory see all of it.

#include <gtest/gtest.h>

#include "fsdp/memory.h"

int main(int argc, char** argv) {
  fsdp::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
