// world.device: resolving "cpu" | "cuda" | "auto" on this build, and, on a
// machine with a GPU and a CUDA build, DDP through the Trainer on the GPU
// equal to one GPU process. The GPU tests skip on CPU-only builds (CI, the
// Debian machine) and run on the GPU machine (scripts/cuda-build.sh).
//
// Tolerance 1e-5 relative, as the CPU oracle tests: 2 thread-ranks over Gloo
// with CUDA tensors sum two half-batch gradients where one process averages
// the whole batch, the same sums in another order; cuBLAS keeps fp32 matmuls
// in fp32 (PyTorch's default: TF32 off for matmuls). Negative control: one
// process on half the batch (a rank without synchronization) differs by > 1e-3.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "paratrain/core/device.h"
#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::mlp_oracle_config;
using paratrain::testing::one_process;
using paratrain::testing::Params;
using paratrain::testing::relative_diff;
using paratrain::testing::train_on;

TEST(Device, ResolvesOnThisBuild) {
  EXPECT_TRUE(core::resolve_device("cpu", 3).is_cpu());
  EXPECT_EQ(core::resolve_device("auto", 0).is_cuda(), core::cuda_usable());
  EXPECT_THROW(core::resolve_device("gpu", 0), ConfigError);
  if (!core::cuda_usable()) {
    try {
      core::resolve_device("cuda", 0);
      FAIL() << "world.device = cuda resolved without a usable GPU";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("world.device = \"cuda\""), std::string::npos) << e.what();
    }
  }
}

Params to_cpu(Params p) {
  for (auto& [name, t] : p) t = t.cpu();
  return p;
}

// DISABLED: on the H100 machine (LibTorch 2.11.0+cu130) two thread-ranks of
// one process, each with its own ProcessGroupGloo over CUDA tensors, hung in
// their first all_reduce (rank 1 timed out in Gloo's recv; 2026-11-25).
// Two *processes* train correctly (docs/cuda.md), so the cause is the
// threads-as-ranks harness under Gloo's CUDA path, not DDP on the GPU. Run it
// with --gtest_also_run_disabled_tests on a GPU machine when looking into it.
TEST(CudaTrainer, DISABLED_DdpOnTheGpuEqualsOneGpuProcess) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-trainer");
  Params distributed;
  bool on_gpu = false;
  paratrain::testing::run_ranks_on("gloo", 2, [&](comm::ProcessGroup& group) {
    TrainConfig c = mlp_oracle_config(dir, "cuda_ddp", 0);
    c.world.device = "cuda";
    train::Trainer t(c, group);
    t.fit();
    auto params = t.full_parameters();
    if (group.rank() == 0) {
      on_gpu = params.front().second.is_cuda();
      distributed = to_cpu(std::move(params));
    }
  });
  EXPECT_TRUE(on_gpu) << "the model did not live on the GPU";
  TrainConfig single = mlp_oracle_config(dir, "cuda_oracle", 0);
  single.world.device = "cuda";
  single.ddp.mode = "none";
  const Params oracle = to_cpu(one_process(single));
  TrainConfig half = single;
  half.run.name = "cuda_half";
  half.data.global_batch_size = 16;
  const double diff = relative_diff(distributed, oracle);
  const double control = relative_diff(to_cpu(one_process(half)), oracle);
  TrainConfig cpu = single;
  cpu.run.name = "cpu_oracle";
  cpu.world.device = "cpu";
  const double gpu_vs_cpu = relative_diff(oracle, one_process(cpu));
  std::printf("[ measured ] DDP 2 ranks on %s vs 1 GPU process: %.3g (half batch, no sync: %.3g); 1 GPU vs 1 CPU "
              "process: %.3g\n",
              core::resolve_device("cuda", 0).str().c_str(), diff, control, gpu_vs_cpu);
  EXPECT_LE(diff, 1e-5);
  EXPECT_GT(control, 1e-3);
}

TEST(CudaTrainer, StrategiesNotYetOnTheGpuAreAConfigError) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-refuse");
  TrainConfig c = mlp_oracle_config(dir, "cuda_zero", 1);
  c.world.device = "cuda";
  EXPECT_THROW(one_process(c), ConfigError);
}

}  // namespace
}  // namespace paratrain::train
