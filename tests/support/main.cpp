// The tests' main: gtest's, after the malloc settings the paratrain CLI uses
// (core/allocator.h), so tests run the allocator configuration users get and
// the suite is not dominated by page faults.
#include <gtest/gtest.h>

#include "paratrain/core/allocator.h"

int main(int argc, char** argv) {
  paratrain::core::retain_freed_memory();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
