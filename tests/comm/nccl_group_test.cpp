// world.backend = "nccl": refused with a clear error where it cannot run
// (a CPU-only build, CPU tensors, more ranks than GPUs on a host), and on a
// GPU machine the world group of one rank over NCCL: every operation, CPU
// tensors through its host group, sub-groups, abort. Multi-rank NCCL needs
// a GPU per rank, which the GPU machines we test on do not have (one GPU:
// NCCL refuses two ranks on it), so the GPU half runs at world size 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "paratrain/comm/nccl/nccl_group.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/device.h"
#include "paratrain/core/error.h"

namespace {

using paratrain::comm::InitOptions;
using paratrain::comm::WorldInfo;

std::string config_error(const WorldInfo& w, const InitOptions& init) {
  try {
    paratrain::comm::init_process_group(w, init);
  } catch (const paratrain::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(NcclGroup, CpuTensorsAreAConfigError) {
  WorldInfo w;
  InitOptions init;
  init.backend = "nccl";
  init.cpu_tensors = true;
  const std::string message = config_error(w, init);
  EXPECT_NE(message.find("world.backend = \"nccl\" carries GPU tensors"), std::string::npos) << message;
  EXPECT_NE(message.find("world.device = \"cuda\""), std::string::npos) << message;
}

TEST(NcclGroup, ACpuOnlyBuildNamesItself) {
  if (paratrain::comm::nccl_compiled()) GTEST_SKIP() << "this build has NCCL";
  WorldInfo w;
  InitOptions init;
  init.backend = "nccl";
  init.cpu_tensors = false;
  const std::string message = config_error(w, init);
  EXPECT_NE(message.find("needs a CUDA build of LibTorch with NCCL"), std::string::npos) << message;
  EXPECT_NE(message.find("scripts/cuda-build.sh"), std::string::npos) << message;
}

// More ranks on a host than GPUs: two would share one, which NCCL refuses.
TEST(NcclGroup, TwoRanksOnOneGpuAreAConfigError) {
  if (!paratrain::comm::nccl_compiled() || !paratrain::core::cuda_usable())
    GTEST_SKIP() << "needs a CUDA build with NCCL and a GPU";
  WorldInfo w;
  w.rank = 0;
  w.world_size = 64;
  w.local_world_size = 64;  // more than any machine's GPUs
  InitOptions init;
  init.backend = "nccl";
  init.cpu_tensors = false;
  const std::string message = config_error(w, init);
  EXPECT_NE(message.find("NCCL refuses two ranks on one GPU"), std::string::npos) << message;
  EXPECT_NE(message.find("world.backend = \"gloo\" or \"shm\""), std::string::npos) << message;
}

TEST(NcclGroup, EveryOperationAtWorldSizeOneOnTheGpu) {
  if (!paratrain::comm::nccl_compiled() || !paratrain::core::cuda_usable())
    GTEST_SKIP() << "needs a CUDA build with NCCL and a GPU";
  WorldInfo w;
  InitOptions init;
  init.backend = "auto";  // picks nccl: GPU tensors and a GPU for the one rank
  init.cpu_tensors = false;
  init.doctor_records = 0;
  auto group = paratrain::comm::init_process_group(w, init);
  ASSERT_EQ(group->backend(), "nccl");
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);

  auto t = torch::arange(6, cuda.dtype(torch::kFloat));
  group->all_reduce(t, paratrain::comm::ReduceOp::kAvg)->wait();
  EXPECT_TRUE(t.is_cuda());
  EXPECT_TRUE(torch::equal(t.cpu(), torch::arange(6, torch::kFloat)));

  auto out = torch::empty({6}, cuda);
  group->all_gather(out, t)->wait();
  EXPECT_TRUE(torch::equal(out.cpu(), t.cpu()));
  auto rs = torch::empty({6}, cuda);
  group->reduce_scatter(rs, t, paratrain::comm::ReduceOp::kMax)->wait();
  EXPECT_TRUE(torch::equal(rs.cpu(), t.cpu()));
  group->broadcast(t, 0)->wait();
  group->reduce(t, 0)->wait();
  auto a2a = torch::empty({6}, cuda);
  group->all_to_all(a2a, t)->wait();
  EXPECT_TRUE(torch::equal(a2a.cpu(), t.cpu()));
  auto g = torch::empty({6}, cuda);
  group->gather(g, t, 0)->wait();
  EXPECT_TRUE(torch::equal(g.cpu(), t.cpu()));
  auto s = torch::empty({6}, cuda);
  group->scatter(s, t, 0)->wait();
  EXPECT_TRUE(torch::equal(s.cpu(), t.cpu()));
  auto uneven = torch::empty({4}, cuda);
  auto piece = torch::arange(4, cuda.dtype(torch::kFloat));
  group->all_gather_uneven(uneven, piece, {4})->wait();
  EXPECT_TRUE(torch::equal(uneven.cpu(), piece.cpu()));

  // CPU tensors and barriers go through the host group.
  auto host = torch::ones({3}, torch::kDouble);
  group->all_reduce(host, paratrain::comm::ReduceOp::kSum)->wait();
  EXPECT_TRUE(host.is_cpu());
  EXPECT_DOUBLE_EQ(host.sum().item<double>(), 3.0);
  group->barrier()->wait();

  auto sub = group->new_subgroup({0});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend(), "nccl");
  auto u = torch::full({2}, 7.0, cuda);
  sub->all_reduce(u)->wait();
  EXPECT_EQ(u.sum().item<float>(), 14.0f);

  group->abort();
  auto after = torch::ones({1}, cuda);
  EXPECT_THROW(group->all_reduce(after), paratrain::CommError);
}

}  // namespace
