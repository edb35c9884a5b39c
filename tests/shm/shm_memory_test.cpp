// What the shm backend's memory looks like from the caller's side:
// - once wait() returns, the group holds none of the operation's tensors
//   (Note [A finished job holds no tensors] in comm/shm/shm_group.cpp): the
//   caller dropping them gets the memory back at once. Without it ZeRO's
//   parameter all-gather buffers outlived the step into the next backward
//   and raised the measured peak by 4 Psi + 4 Psi / N;
// - symmetric memory (DDP's and ZeRO-1's bucket buffers) counts in the
//   memory meter (core/memory_meter.h) as this rank's copy, mapped and
//   unmapped, so `paratrain plan --measure` sees the buckets; a block goes
//   with its last tensor, not only with its group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>

#include "paratrain/core/memory_meter.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::comm::ProcessGroup;
using paratrain::testing::run_ranks_on;

// Many operations, each checked the moment its wait returns: the worker
// thread that ran it must have let go of its input and output already. A
// worker that drops them only after waking the caller is caught by the
// scheduler in some of the rounds (it is on 2 cores with 4 threads busy).
TEST(ShmMemory, AWaitedOperationHoldsNoTensors) {
  std::atomic<int> held{0};
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    for (int i = 0; i < 400; ++i) {
      at::Tensor in = torch::full({4096}, static_cast<float>(pg.rank()));
      at::Tensor out = torch::empty({2 * 4096});
      pg.all_gather(out, in)->wait();
      if (in.use_count() != 1 || out.use_count() != 1) held.fetch_add(1);
      at::Tensor t = torch::ones({1024});
      pg.all_reduce(t)->wait();
      if (t.use_count() != 1) held.fetch_add(1);
    }
  });
  EXPECT_EQ(held.load(), 0) << "rounds in which the group still held a tensor after wait() returned";
}

TEST(ShmMemory, SymmetricBuffersCountInTheMemoryMeter) {
  paratrain::core::install_memory_meter();
  paratrain::core::begin_memory_window();
  const int64_t before = paratrain::core::memory_meter().live_bytes;
  std::atomic<int64_t> while_mapped{0}, after_dropped{0};
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    at::Tensor t = pg.allocate_symmetric(250000, at::kFloat);  // 1 MB per rank
    pg.all_reduce(t)->wait();  // in place, through the block
    pg.barrier()->wait();
    if (pg.rank() == 0) while_mapped = paratrain::core::memory_meter().live_bytes - before;
    pg.barrier()->wait();
    // Its tensor gone, a block is unmapped while the group lives on.
    t = at::Tensor();
    pg.barrier()->wait();
    if (pg.rank() == 0) after_dropped = paratrain::core::memory_meter().live_bytes - before;
    pg.barrier()->wait();
    at::Tensor u = torch::ones({8});
    pg.all_reduce(u)->wait();  // the group still works, through its slots
    EXPECT_TRUE(torch::equal(u, torch::full({8}, 2.0f)));
  });
  EXPECT_LT(after_dropped.load(), 100000);
  // Both ranks (threads of this process) mapped their copy: 2 MB, give or
  // take the small tensors the groups made meanwhile.
  EXPECT_GE(while_mapped.load(), 2000000);
  EXPECT_LT(while_mapped.load(), 2100000);
  // Gone with the groups.
  EXPECT_LT(paratrain::core::memory_meter().live_bytes - before, 100000);
  EXPECT_GE(paratrain::core::memory_meter().peak_bytes - paratrain::core::memory_meter().baseline_bytes, 2000000);
}

}  // namespace
