// world.device: resolving "cpu" | "cuda" | "auto" on this build. The GPU
// tests skip on CPU-only builds (CI, the Debian machine) and run on the GPU
// machine (scripts/cuda-check.sh, which also runs the multi-rank GPU oracle
// as processes: see below).
#include <gtest/gtest.h>

#include <string>

#include <ATen/Context.h>

#include "paratrain/core/device.h"
#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/device_placement.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::mlp_oracle_config;

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


// No thread-rank oracle on the GPU: on an H200 (LibTorch 2.11.0+cu130,
// 2026-11-26) two thread-ranks training DDP or ZeRO-1 on cuda:0 hung in their
// first step even with every collective staged through host memory, as two
// thread-ranks had hung in Gloo's own CUDA all-reduce the day before. The
// likely cause is LibTorch's autograd engine, not the collectives: it runs
// every backward on one device of a process in a single worker thread, so a
// rank whose backward hook waits for its peer's gradients blocks the thread
// the peer's backward needs. Processes have an engine each: the GPU oracle
// runs through `paratrain launch` in scripts/cuda-check.sh (2 processes on
// one GPU vs 1 GPU process, consolidated checkpoints compared):
// bench/results/2026-11-26-cuda-h200.md.

TEST(CudaTrainer, ResolvesToThisRanksGpu) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  TrainConfig c = mlp_oracle_config("unused", "cuda_resolved", 0);
  c.world.device = "cuda";
  EXPECT_TRUE(training_device(c).is_cuda());
  c.world.device = "auto";
  EXPECT_TRUE(training_device(c).is_cuda());
}

// zero.offload = "cpu" moves optimizer state off a GPU: a ConfigError that
// says why wherever it would mean nothing (a CPU-only build, a CPU run, DDP)
// or is not built (pipelines, tp, cp).
TEST(ZeroOffload, RefusedWhereOptimizerStateIsInHostMemoryAlready) {
  TrainConfig c = mlp_oracle_config("unused", "offload", 0);
  c.zero.stage = 2;
  c.zero.offload = "cpu";
  auto message = [&] {
    try {
      validate_config(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string cpu = message();
  EXPECT_NE(cpu.find(at::hasCUDA() ? "world.device = \"cpu\"" : "CPU-only LibTorch"), std::string::npos) << cpu;
  c.zero.stage = 0;
  EXPECT_NE(message().find("zero.stage = 0"), std::string::npos) << message();
  c.zero.stage = 1;
  c.parallel.pp = 2;
  EXPECT_NE(message().find("pp = 2"), std::string::npos) << message();
}

}  // namespace
}  // namespace paratrain::train
