// world.device: resolving "cpu" | "cuda" | "auto" on this build, and, on a
// machine with a GPU and a CUDA build, DDP through the Trainer on the GPU
// equal to one GPU process. The GPU tests skip on CPU-only builds (CI, the
// Debian machine) and run on the GPU machine (scripts/cuda-build.sh).
//
// Tolerance 1e-5 relative, as the CPU oracle tests: 2 thread-ranks over Gloo
// (CUDA tensors staged through host memory) sum two half-batch gradients where one process averages
// the whole batch, the same sums in another order; cuBLAS keeps fp32 matmuls
// in fp32 (PyTorch's default: TF32 off for matmuls). Negative control: one
// process on half the batch (a rank without synchronization) differs by > 1e-3.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "paratrain/core/device.h"
#include "paratrain/core/error.h"
#include "paratrain/train/device_placement.h"
#include "tests/support/gpt_run.h"
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

// Each strategy on 2 thread-ranks over Gloo with CUDA tensors (staged through
// host memory, comm/host_staging_group.h, as init_process_group does for GPU
// runs) against one GPU process. On 2026-11-25 (LibTorch 2.11.0+cu130, H100)
// two thread-ranks hung in Gloo's own CUDA all-reduce; staging keeps Gloo on
// host memory, which thread-ranks run everywhere else.
struct GpuRun {
  Params params;
  bool on_gpu = false;
};

GpuRun two_gpu_ranks(const TrainConfig& c) {
  GpuRun out;
  paratrain::testing::run_ranks_on("gloo", 2, [&](comm::ProcessGroup& group) {
    train::Trainer t(c, group);
    t.fit();
    auto params = t.full_parameters();
    if (group.rank() == 0) {
      out.on_gpu = params.front().second.is_cuda();
      out.params = to_cpu(std::move(params));
    }
  });
  return out;
}

void expect_equals_one_gpu_process(TrainConfig c, const std::string& what) {
  c.world.device = "cuda";
  const GpuRun distributed = two_gpu_ranks(c);
  EXPECT_TRUE(distributed.on_gpu) << what << ": the model did not live on the GPU";
  TrainConfig single = c;
  single.run.name += "_oracle";
  single.zero.stage = 0;
  single.parallel.tp = single.parallel.cp = 1;
  single.ddp.mode = "none";
  const Params oracle = to_cpu(one_process(single));
  TrainConfig half = single;
  half.run.name += "_half";
  if (half.data.global_batch_size > 0) half.data.global_batch_size /= 2;
  else half.data.batch_size /= 2;
  const double diff = relative_diff(distributed.params, oracle);
  const double control = relative_diff(to_cpu(one_process(half)), oracle);
  std::printf("[ measured ] %s, 2 ranks on %s vs 1 GPU process: %.3g (half batch, no sync: %.3g)\n", what.c_str(),
              core::resolve_device("cuda", 0).str().c_str(), diff, control);
  EXPECT_LE(diff, 1e-5) << what;
  EXPECT_GT(control, 1e-3) << what;
}

TEST(CudaTrainer, DdpOnTheGpuEqualsOneGpuProcess) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-trainer");
  expect_equals_one_gpu_process(mlp_oracle_config(dir, "cuda_ddp", 0), "ddp");
  // One GPU process against one CPU process: the same model, other kernels.
  TrainConfig single = mlp_oracle_config(dir, "gpu_single", 0);
  single.world.device = "cuda";
  TrainConfig cpu = mlp_oracle_config(dir, "cpu_single", 0);
  std::printf("[ measured ] 1 GPU vs 1 CPU process: %.3g\n", relative_diff(to_cpu(one_process(single)), one_process(cpu)));
}

TEST(CudaTrainer, ZeroOnTheGpuEqualsOneGpuProcess) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-zero");
  expect_equals_one_gpu_process(mlp_oracle_config(dir, "cuda_zero1", 1), "zero-1");
  expect_equals_one_gpu_process(mlp_oracle_config(dir, "cuda_zero2", 2), "zero-2");
}

TEST(CudaTrainer, FsdpOnTheGpuEqualsOneGpuProcess) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-fsdp");
  TrainConfig c = mlp_oracle_config(dir, "cuda_fsdp", 3);
  c.zero.unit_min_params = 1000;  // several units, so gathers and frees interleave
  expect_equals_one_gpu_process(c, "fsdp");
}

TEST(CudaTrainer, TensorAndContextParallelGptOnTheGpuEqualsOneGpuProcess) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  const std::string dir = paratrain::testing::temp_dir("cuda-megatron");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 7);
  TrainConfig tp = paratrain::testing::tiny_gpt_config(dir, corpus);
  tp.run.name = "cuda_tp2";
  tp.parallel.tp = 2;
  expect_equals_one_gpu_process(tp, "gpt tp 2");
  TrainConfig cp = paratrain::testing::tiny_gpt_config(dir, corpus);
  cp.run.name = "cuda_cp2";
  cp.parallel.cp = 2;
  expect_equals_one_gpu_process(cp, "gpt cp 2");
}

TEST(CudaTrainer, StrategiesNotYetOnTheGpuAreAConfigError) {
  if (!core::cuda_usable()) GTEST_SKIP() << "needs a CUDA build of LibTorch and a GPU";
  TrainConfig c = mlp_oracle_config("unused", "cuda_refused", 0);
  c.world.device = "cuda";
  EXPECT_NO_THROW(training_device(c, "zero"));
  EXPECT_THROW(training_device(c, "pipeline"), ConfigError);
  EXPECT_THROW(training_device(c, "ps"), ConfigError);
  c.parallel.pp = 2;
  EXPECT_THROW(training_device(c, "megatron"), ConfigError);
}

}  // namespace
}  // namespace paratrain::train
