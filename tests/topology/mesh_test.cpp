// ParallelDims arithmetic and DeviceMesh groups on real Gloo groups (ranks as
// threads): every axis group holds the ranks that differ only in that axis,
// and a collective on it reduces over exactly those ranks.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <set>

#include "paratrain/core/error.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/topology/stage_group.h"
#include "tests/support/multi_rank.h"

namespace paratrain::topology {
namespace {

TEST(ParallelDims, DpDefaultsToWhatIsLeft) {
  auto d = ParallelDims::resolve(0, 2, 1, 1, 8);
  EXPECT_EQ(d.dp, 4);
  EXPECT_EQ(d.product(), 8);
}

TEST(ParallelDims, MismatchNamesEveryFactor) {
  try {
    ParallelDims::resolve(2, 2, 1, 1, 6);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp(2) * tp(2) * pp(1) * cp(1) != world_size(6)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ParallelDims::resolve(0, 4, 1, 1, 6), ConfigError);  // 6 % 4 != 0
  EXPECT_THROW(ParallelDims::resolve(0, 0, 1, 1, 6), ConfigError);
}

TEST(ParallelDims, CoordinatesRoundTripWithTpInnermost) {
  ParallelDims d{.dp = 2, .tp = 2, .pp = 3, .cp = 1};
  std::set<int> seen;
  for (int r = 0; r < d.product(); ++r) {
    auto c = coords_of(d, r);
    EXPECT_EQ(rank_of(d, c), r);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 12u);
  // Neighbouring ranks are tp peers; pp is the slowest-varying coordinate.
  EXPECT_EQ(coords_of(d, 1)[Axis::kTp], 1);
  EXPECT_EQ(coords_of(d, 1)[Axis::kDp], 0);
  EXPECT_EQ(coords_of(d, 4)[Axis::kPp], 1);
}

// A sum over each axis group of (1 << world rank) names exactly its members.
TEST(DeviceMesh, AxisGroupsHoldRanksDifferingOnlyInThatAxis) {
  const ParallelDims dims{.dp = 2, .tp = 2, .pp = 1, .cp = 1};
  testing::run_ranks(4, [&](comm::ProcessGroup& world) {
    DeviceMesh mesh(world, dims);
    for (Axis axis : kAxes) {
      auto& g = mesh.group(axis);
      ASSERT_EQ(g.size(), dims.size(axis));
      ASSERT_EQ(g.rank(), mesh.rank(axis));
      auto bits = torch::tensor({int64_t{1} << world.rank()}, torch::kLong);
      g.all_reduce(bits, comm::ReduceOp::kSum)->wait();
      int64_t expected = 0;
      MeshCoords c = mesh.coords();
      for (int i = 0; i < dims.size(axis); ++i) {
        c.at[static_cast<int>(axis)] = i;
        expected |= int64_t{1} << rank_of(dims, c);
      }
      EXPECT_EQ(bits.item<int64_t>(), expected) << "axis " << to_string(axis) << " on rank " << world.rank();
    }
  });
}

// dp x cp over 8 ranks (dp 2, cp 2, tp 2): the group of the ranks that share
// the tp coordinate, i.e. every replica of a tensor-parallel shard.
TEST(DeviceMesh, JointGroupHoldsRanksDifferingOnlyInTheJoinedAxes) {
  const ParallelDims dims{.dp = 2, .tp = 2, .pp = 1, .cp = 2};
  testing::run_ranks(8, [&](comm::ProcessGroup& world) {
    DeviceMesh mesh(world, dims);
    auto g = mesh.new_joint_group({Axis::kDp, Axis::kCp});
    ASSERT_EQ(g->size(), 4);
    auto bits = torch::tensor({int64_t{1} << world.rank()}, torch::kLong);
    g->all_reduce(bits, comm::ReduceOp::kSum)->wait();
    int64_t expected = 0;
    for (int r = 0; r < 8; ++r) {
      if (coords_of(dims, r)[Axis::kTp] == mesh.rank(Axis::kTp)) expected |= int64_t{1} << r;
    }
    EXPECT_EQ(bits.item<int64_t>(), expected) << "rank " << world.rank();
    // Spanning the whole world: the world itself.
    EXPECT_EQ(mesh.new_joint_group({Axis::kDp, Axis::kCp, Axis::kTp}).get(), &world);
  });
}

// The embedding group of pp = 4 x tp = 2: stages 0 and 3 of each tp rank's
// pipeline; ranks of stages 1 and 2 are in none.
TEST(DeviceMesh, StageGroupHoldsTheListedStagesOfOnePipeline) {
  const ParallelDims dims{.dp = 1, .tp = 2, .pp = 4, .cp = 1};
  testing::run_ranks(8, [&](comm::ProcessGroup& world) {
    DeviceMesh mesh(world, dims);
    auto g = new_stage_group(mesh, {0, 3});
    // A rank that returns tears its groups down: not while a peer may still
    // be connecting to it (a Gloo pair whose other side is gone fails with
    // "Connection closed by peer").
    world.barrier()->wait();
    const int stage = mesh.rank(Axis::kPp);
    if (stage != 0 && stage != 3) {
      EXPECT_EQ(g, nullptr);
      return;
    }
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(g->size(), 2);
    EXPECT_EQ(g->rank(), stage == 0 ? 0 : 1);  // stage order
    auto bits = torch::tensor({int64_t{1} << world.rank()}, torch::kLong);
    g->all_reduce(bits, comm::ReduceOp::kSum)->wait();
    MeshCoords first = mesh.coords(), last = mesh.coords();
    first.at[static_cast<int>(Axis::kPp)] = 0;
    last.at[static_cast<int>(Axis::kPp)] = 3;
    EXPECT_EQ(bits.item<int64_t>(), (int64_t{1} << rank_of(dims, first)) | (int64_t{1} << rank_of(dims, last)));
  });
  testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    DeviceMesh mesh(world, {.dp = 1, .tp = 1, .pp = 2, .cp = 1});
    EXPECT_THROW(new_stage_group(mesh, {1, 0}), Error);
    EXPECT_THROW(new_stage_group(mesh, {0, 2}), Error);
  });
}

TEST(DeviceMesh, WholeWorldAxisReusesTheWorldGroup) {
  testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    DeviceMesh mesh(world, ParallelDims{.dp = 2});
    EXPECT_EQ(&mesh.group(Axis::kDp), &world);
    EXPECT_EQ(mesh.group(Axis::kTp).size(), 1);
  });
}

TEST(DeviceMesh, RefusesDimsThatDoNotCoverTheWorld) {
  testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    EXPECT_THROW(DeviceMesh(world, ParallelDims{.dp = 1}), ConfigError);
  });
}

}  // namespace
}  // namespace paratrain::topology
