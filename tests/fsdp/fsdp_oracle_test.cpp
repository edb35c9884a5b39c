// FSDP (ZeRO stage 3) against the oracle: training on 1, 2, 3 and 4 ranks
// (threads) must give the parameters one process gets on the full global
// batch, for the MLP and the CNN, with SGD (momentum), Adam and AdamW, units
// by size threshold and by name, reshard_after_forward and prefetch on and off.
//
// Setup: 20 steps of a 12-row global batch (divisible by 2, 3 and 4), mean
// cross-entropy; rank r takes rows [r*12/W, (r+1)*12/W) and builds its model
// from seed + r, so construction's broadcast from rank 0 is exercised.
//
// Tolerance: 1e-5 relative (max |fsdp - oracle| / max |oracle| per tensor),
// as for DDP (tests/ddp/ddp_oracle_test.cpp): the same math in a different
// float32 summation order (per-rank means, pre-divided, summed by the
// reduce-scatter). A run whose reduce-scatter does not reduce is off by >1e-3.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/fsdp/fsdp_training.h"
#include "tests/support/forwarding_group.h"

namespace paratrain::fsdp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 12;
constexpr uint64_t kSeed = 1234;

enum class Units { kThreshold, kNamed };

struct OracleCase {
  ModelKind model;
  int world;
  Opt opt;
  Units units;
  bool reshard;
  bool prefetch;
};

std::string name_of(const OracleCase& c) {
  return std::string(ddp::testing::to_string(c.model)) + "_" + std::to_string(c.world) + "Ranks_" +
         to_string(c.opt) + (c.units == Units::kThreshold ? "_Threshold" : "_Named") +
         (c.reshard ? "_Reshard" : "_Keep") + (c.prefetch ? "_Prefetch" : "_NoPrefetch");
}
void PrintTo(const OracleCase& c, std::ostream* os) { *os << name_of(c); }

// MLP (fc0 2080, fc1 1056, fc2 330 elements): threshold 1500 gives {fc0},
// {fc1+fc2}; names "fc0,fc2" give a root unit {fc1} that runs between them.
// CNN (conv0 40, conv1 296, fc0 528, fc1 170): threshold 300 gives
// {conv0+conv1}, {fc0}, {fc1}; names "conv1,fc0" give a root unit {conv0, fc1}
// used first and last.
FsdpOptions options_for(const OracleCase& c) {
  FsdpOptions o;
  const bool mlp = c.model == ModelKind::kMlp;
  if (c.units == Units::kThreshold) {
    o.unit_min_params = mlp ? 1500 : 300;
  } else {
    o.unit_modules = mlp ? std::vector<std::string>{"fc0", "fc2"} : std::vector<std::string>{"conv1", "fc0"};
  }
  o.reshard_after_forward = c.reshard;
  o.prefetch = c.prefetch;
  return o;
}

class FsdpOracleTest : public ::testing::TestWithParam<OracleCase> {};

TEST_P(FsdpOracleTest, MatchesSingleProcessTraining) {
  const OracleCase c = GetParam();
  const Problem problem = ddp::testing::make_problem(kSteps, kGlobalBatch, /*seed=*/7);
  const Snapshot oracle = c.opt == Opt::kSgd ? ddp::testing::train_single_process(c.model, problem, kSeed)
                                             : train_oracle(c.model, problem, kSeed, {.opt = c.opt});
  FsdpRun run;
  run.model = c.model;
  run.world = c.world;
  run.fsdp = options_for(c);
  run.opt = c.opt;
  run.seed = kSeed;
  int64_t units = 0;
  run.inspect = [&](FullyShardedDataParallel& fsdp, torch::optim::Optimizer&, int rank) {
    if (rank == 0) units = static_cast<int64_t>(fsdp.units().size());
  };
  const std::vector<RankResult> ranks = train_fsdp(run, problem);

  ASSERT_GE(units, 2);
  std::printf("[ measured ] after %d steps: relative diff to 1 process %.3g\n", kSteps,
              ddp::testing::max_relative_diff(ranks[0].params, oracle));
  for (int r = 0; r < c.world; ++r) {
    EXPECT_LE(ddp::testing::max_relative_diff(ranks[r].params, oracle), kTolerance) << "rank " << r;
    const FsdpStats& s = ranks[r].stats;
    // Without reshard_after_forward each unit is gathered once per step. With
    // it, backward gathers units again (not necessarily all: the first
    // layer's backward does not read its weight when the input needs no
    // gradient, and gathering on touch notices).
    if (c.reshard) {
      EXPECT_GT(s.all_gathers, kSteps * units) << "rank " << r;
    } else {
      EXPECT_EQ(s.all_gathers, kSteps * units) << "rank " << r;
    }
    EXPECT_EQ(s.frees, s.all_gathers + units) << "rank " << r;  // + the frees at construction
    EXPECT_EQ(s.reduce_scatters, kSteps * units) << "rank " << r;
    // The first step learns the order and prefetches nothing.
    if (c.prefetch) {
      EXPECT_GE(s.prefetches, kSteps - 1) << "rank " << r;
    } else {
      EXPECT_EQ(s.prefetches, 0) << "rank " << r;
    }
  }
  // Training moved the parameters (a no-op run would trivially match itself).
  const Snapshot initial = ddp::testing::snapshot(*ddp::testing::make_model(c.model, kSeed));
  EXPECT_GT(ddp::testing::max_relative_diff(oracle, initial), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Stage3, FsdpOracleTest,
    ::testing::Values(OracleCase{ModelKind::kMlp, 1, Opt::kAdam, Units::kThreshold, true, true},
                      OracleCase{ModelKind::kMlp, 2, Opt::kSgd, Units::kThreshold, true, true},
                      OracleCase{ModelKind::kMlp, 3, Opt::kAdam, Units::kThreshold, true, true},
                      OracleCase{ModelKind::kMlp, 4, Opt::kSgd, Units::kNamed, false, true},
                      OracleCase{ModelKind::kMlp, 4, Opt::kAdamW, Units::kNamed, true, false},
                      OracleCase{ModelKind::kMlp, 3, Opt::kSgd, Units::kNamed, true, true},
                      OracleCase{ModelKind::kCnn, 2, Opt::kAdam, Units::kNamed, true, false},
                      OracleCase{ModelKind::kCnn, 3, Opt::kSgd, Units::kThreshold, false, false},
                      OracleCase{ModelKind::kCnn, 4, Opt::kAdam, Units::kThreshold, true, true},
                      OracleCase{ModelKind::kCnn, 2, Opt::kSgd, Units::kNamed, false, true}),
    [](const auto& info) { return name_of(info.param); });

// One unit per layer (one reducer bucket each, UnitGradSink as the sink, the
// reducer releasing each .grad once copied) meets the same oracle, also with
// no_sync accumulation (two micro-batches per step equal one batch).
TEST(FsdpOracle, OneUnitPerLayerMatchesSingleProcessTraining) {
  struct Case {
    ModelKind model;
    int world;
    Opt opt;
    int accumulate;
  };
  for (const Case c : {Case{ModelKind::kMlp, 3, Opt::kAdam, 1}, Case{ModelKind::kCnn, 2, Opt::kSgd, 1},
                       Case{ModelKind::kMlp, 2, Opt::kSgd, 2}}) {
    const Problem problem = ddp::testing::make_problem(kSteps, kGlobalBatch, /*seed=*/7);
    const Snapshot oracle = train_oracle(c.model, problem, kSeed, {.opt = c.opt});
    FsdpRun run;
    run.model = c.model;
    run.world = c.world;
    run.opt = c.opt;
    run.accumulate = c.accumulate;
    run.seed = kSeed;
    run.fsdp.unit_min_params = 0;
    const std::vector<RankResult> ranks = train_fsdp(run, problem);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_LE(ddp::testing::max_relative_diff(ranks[r].params, oracle), kTolerance)
          << ddp::testing::to_string(c.model) << " rank " << r << " accumulate " << c.accumulate;
      EXPECT_EQ(ranks[r].stats.reduce_scatters, kSteps * (c.model == ModelKind::kMlp ? 3 : 4));
    }
  }
}

// Forwards every call to `inner` except reduce_scatter, which keeps this
// rank's own slice without reducing: each rank steps on its own gradient.
class NoReduceGroup final : public paratrain::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  comm::WorkHandle reduce_scatter(at::Tensor& out, const at::Tensor& in, comm::ReduceOp) override {
    out.view({-1}).copy_(in.view({-1}).narrow(0, rank() * out.numel(), out.numel()).mul(size()));
    return inner().barrier();
  }
};

// The tolerance discriminates: the same 2-rank run with a reduce-scatter that
// does not reduce (each rank keeps its own, un-averaged slice) is far off.
TEST(FsdpOracle, WithoutReductionDiffersFromOracle) {
  const Problem problem = ddp::testing::make_problem(kSteps, kGlobalBatch, /*seed=*/7);
  const Snapshot oracle = ddp::testing::train_single_process(ModelKind::kMlp, problem, kSeed);
  FsdpRun run;
  run.world = 2;
  run.fsdp.unit_min_params = 1500;
  run.seed = kSeed;
  run.wrap_group = [](comm::ProcessGroup& g) { return std::make_unique<NoReduceGroup>(g); };
  const std::vector<RankResult> ranks = train_fsdp(run, problem);
  EXPECT_GT(ddp::testing::max_relative_diff(ranks[0].params, oracle), 1e-3);
}

}  // namespace
}  // namespace paratrain::fsdp::testing
