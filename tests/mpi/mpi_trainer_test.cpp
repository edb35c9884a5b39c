// DDP and ZeRO-2 through the Trainer over the MPI backend equal one process
// on the same global batch. Run by CTest as `mpirun -np 2 test_mpi` with
// PARATRAIN_TEST_BACKEND=mpi (tests/CMakeLists.txt): each MPI process is one
// rank; rank 0 also trains the oracle on a one-rank Gloo group of its own.
//
// Tolerance 1e-5 relative, as the Gloo oracle tests: the same sums in
// another order (MPI's reduction vs one process's batch mean). Negative
// control: ranks that do not synchronize (ddp.mode = "none" is refused at 2
// ranks, so the same run with each rank's half batch and no reduction is
// emulated by a 1-rank run on half the batch) differ by > 1e-3.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using Params = std::vector<std::pair<std::string, at::Tensor>>;

// Every process of one mpirun shares the parent (mpirun's daemon), so this
// names one folder for all ranks of a run without any communication.
std::string shared_dir() {
  return (std::filesystem::temp_directory_path() / ("paratrain_mpi_test_" + std::to_string(getppid()))).string();
}

TrainConfig mlp_config(const std::string& name, int64_t zero_stage) {
  return paratrain::testing::mlp_oracle_config(shared_dir(), name, zero_stage);
}

using paratrain::testing::one_process;
using paratrain::testing::relative_diff;
using paratrain::testing::train_on;

void expect_equals_one_process(int64_t zero_stage) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    ASSERT_EQ(group.backend(), "mpi") << "run this test under mpirun with PARATRAIN_TEST_BACKEND=mpi";
    const std::string name = "mpi_zero" + std::to_string(zero_stage);
    const Params distributed = train_on(mlp_config(name, zero_stage), group);
    if (group.rank() != 0) return;
    TrainConfig single = mlp_config(name + "_oracle", 0);
    single.ddp.mode = "none";
    const Params oracle = one_process(single);
    TrainConfig half = single;
    half.run.name = name + "_half";
    half.data.global_batch_size = 16;
    const double diff = relative_diff(distributed, oracle);
    const double control = relative_diff(one_process(half), oracle);
    std::printf("[ measured ] zero.stage %ld over MPI vs 1 process: %.3g (half batch, no sync: %.3g)\n",
                static_cast<long>(zero_stage), diff, control);
    EXPECT_LE(diff, 1e-5);
    EXPECT_GT(control, 1e-3);
  });
}

TEST(MpiTrainer, DdpEqualsOneProcess) { expect_equals_one_process(0); }
TEST(MpiTrainer, Zero2EqualsOneProcess) { expect_equals_one_process(2); }

}  // namespace
}  // namespace paratrain::train
