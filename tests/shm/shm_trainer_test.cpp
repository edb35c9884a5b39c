// DDP and ZeRO-2 through the Trainer over the shm backend equal one process
// on the same global batch: 2 rank threads, each with an shm group (threads
// map the segment as processes would); rank 0 also trains the oracle on a
// one-rank Gloo group of its own. The same over hierarchical groups
// (comm/hierarchical_group.h): 4 rank threads as 2 nodes of 2, shm inside
// each node, Gloo between the leaders.
//
// Tolerance 1e-5 relative, as the Gloo and MPI oracle tests: the same sums
// in another order (the shm reduction adds rank 0's half-batch gradient to
// rank 1's; one process averages the whole batch at once). Negative control:
// a 1-rank run on one rank's share of the batch (what a rank would train
// without synchronization) differs by > 1e-3, so the check can fail.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::mlp_oracle_config;
using paratrain::testing::one_process;
using paratrain::testing::Params;
using paratrain::testing::relative_diff;
using paratrain::testing::train_on;

void expect_equals_one_process(int64_t zero_stage, const std::string& backend = "shm", int world = 2) {
  const std::string dir = paratrain::testing::temp_dir("shm-trainer");
  const std::string name = backend + "_zero" + std::to_string(zero_stage);
  Params distributed;
  paratrain::testing::run_ranks_on(backend, world, [&](comm::ProcessGroup& group) {
    ASSERT_EQ(group.backend().substr(0, backend.size()), backend);
    auto params = train_on(mlp_oracle_config(dir, name, zero_stage), group);
    if (group.rank() == 0) distributed = std::move(params);
  });
  TrainConfig single = mlp_oracle_config(dir, name + "_oracle", 0);
  single.ddp.mode = "none";
  const Params oracle = one_process(single);
  TrainConfig half = single;
  half.run.name = name + "_half";
  half.data.global_batch_size = single.data.global_batch_size / world;
  const double diff = relative_diff(distributed, oracle);
  const double control = relative_diff(one_process(half), oracle);
  std::printf("[ measured ] zero.stage %ld over %s x%d vs 1 process: %.3g (one rank's batch, no sync: %.3g)\n",
              static_cast<long>(zero_stage), backend.c_str(), world, diff, control);
  EXPECT_LE(diff, 1e-5);
  EXPECT_GT(control, 1e-3);
}

TEST(ShmTrainer, DdpEqualsOneProcess) { expect_equals_one_process(0); }
TEST(ShmTrainer, Zero2EqualsOneProcess) { expect_equals_one_process(2); }
TEST(HierarchicalTrainer, DdpEqualsOneProcess) { expect_equals_one_process(0, "hierarchical", 4); }

}  // namespace
}  // namespace paratrain::train
