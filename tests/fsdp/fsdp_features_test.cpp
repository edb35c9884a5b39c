// FSDP features beyond the oracle run: unit planning, memory (only shards
// alive between steps; what reshard_after_forward keeps during a step),
// evaluation under NoGradGuard, no_sync accumulation, clipping, checkpoint
// slots. Each compares with single-process training or the unsharded model.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/fsdp/unit_plan.h"
#include "tests/fsdp/fsdp_training.h"
#include "tests/support/forwarding_group.h"
#include "tests/support/multi_rank.h"

namespace paratrain::fsdp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 1234;

FsdpOptions with_units(int64_t min_params, bool reshard_after_forward = true) {
  FsdpOptions o;
  o.unit_min_params = min_params;
  o.reshard_after_forward = reshard_after_forward;
  return o;
}

UnitPlanOptions by_size(int64_t min_params) {
  UnitPlanOptions o;
  o.min_params = min_params;
  return o;
}

UnitPlanOptions by_name(std::vector<std::string> modules) {
  UnitPlanOptions o;
  o.modules = std::move(modules);
  return o;
}

std::vector<std::string> unit_names(torch::nn::Module& model, const UnitPlanOptions& options) {
  std::vector<std::string> names;
  for (const auto& unit : plan_units(model, options)) names.push_back(unit.name);
  return names;
}

TEST(FsdpUnits, ByThresholdAndByName) {
  auto mlp = ddp::testing::make_model(ModelKind::kMlp, kSeed);
  EXPECT_EQ(unit_names(*mlp, by_size(1500)), (std::vector<std::string>{"fc0", "fc1+fc2"}));
  EXPECT_EQ(unit_names(*mlp, by_size(0)), (std::vector<std::string>{"fc0", "fc1", "fc2"}));
  EXPECT_EQ(unit_names(*mlp, by_size(1 << 30)), (std::vector<std::string>{"fc0+fc1+fc2"}));
  const auto named = plan_units(*mlp, by_name(split_module_list(" fc0, fc2,")));
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].name, "(root)");
  ASSERT_EQ(named[0].params.size(), 2u);
  EXPECT_EQ(named[0].params[0].first, "fc1.weight");
  EXPECT_EQ(named[1].name, "fc0");
  EXPECT_EQ(named[2].name, "fc2");
  EXPECT_THROW(plan_units(*mlp, by_name({"fc9"})), c10::Error);
}

// Between steps only the shards are alive: every unit's gathered storage is
// freed (0 bytes), parameters count 1/world of the padded model, gradients
// and Adam's two moments one shard each.
TEST(FsdpMemory, OnlyShardsAliveBetweenSteps) {
  const Problem problem = ddp::testing::make_problem(3, 12, /*seed=*/7);
  FsdpRun run;
  run.world = 3;
  run.opt = Opt::kAdam;
  run.fsdp.unit_min_params = 0;
  run.inspect = [](FullyShardedDataParallel& fsdp, torch::optim::Optimizer& opt, int rank) {
    int64_t shard_elements = 0, padded = 0, full = 0;
    for (const UnitInfo& u : fsdp.units()) {
      EXPECT_EQ(u.gathered_bytes, 0) << "unit " << u.name << " rank " << rank;
      shard_elements += u.shard_numel;
      padded += u.padded_numel;
      full += u.numel;
    }
    EXPECT_EQ(padded, 3 * shard_elements);
    for (const auto& p : fsdp.module()->parameters()) {
      EXPECT_EQ(p.storage().nbytes(), 0u);
      EXPECT_FALSE(p.grad().defined());
    }
    int64_t piece_elements = 0;
    for (const auto& p : fsdp.optimizer_params()) piece_elements += p.numel();
    EXPECT_LE(piece_elements, shard_elements);
    const ModelStateBytes bytes = fsdp.model_state_bytes(&opt);
    EXPECT_EQ(bytes.params, shard_elements * 4);
    EXPECT_EQ(bytes.grads, piece_elements * 4);
    EXPECT_EQ(bytes.optimizer_state, 2 * piece_elements * 4);
    EXPECT_LT(bytes.params, full * 4 / 2);
  };
  train_fsdp(run, problem);
}

// After forward and before backward: with reshard_after_forward only the
// last unit is still gathered; without it every unit is.
TEST(FsdpMemory, ReshardAfterForwardKeepsOnlyTheLastUnit) {
  for (bool reshard : {true, false}) {
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
      auto model = ddp::testing::make_model(ModelKind::kMlp, kSeed);
      FullyShardedDataParallel fsdp(model, group, with_units(0, reshard));
      fsdp.prepare_forward();
      auto out = model->forward(torch::ones({2, 64}));
      int gathered = 0;
      for (const UnitInfo& u : fsdp.units()) gathered += u.gathered_bytes > 0;
      EXPECT_EQ(gathered, reshard ? 1 : 3) << "reshard " << reshard;
      out.sum().backward();
      for (const UnitInfo& u : fsdp.units()) EXPECT_EQ(u.gathered_bytes, 0) << u.name;
    });
  }
}

// Evaluation under NoGradGuard after a few steps gives the single-process
// model's output, and frees every unit afterwards.
TEST(FsdpEval, NoGradForwardEqualsSingleProcessModel) {
  const Problem problem = ddp::testing::make_problem(5, 12, /*seed=*/7);
  const Snapshot oracle = ddp::testing::train_single_process(ModelKind::kCnn, problem, kSeed);
  auto reference = ddp::testing::make_model(ModelKind::kCnn, kSeed);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < oracle.size(); ++i) reference->parameters()[i].copy_(oracle[i].second);
  }
  const at::Tensor x = problem.batch_inputs(0);
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = reference->forward(x);
  }
  FsdpRun run;
  run.model = ModelKind::kCnn;
  run.world = 2;
  run.fsdp.unit_min_params = 300;
  run.inspect = [&](FullyShardedDataParallel& fsdp, torch::optim::Optimizer&, int rank) {
    auto& model = dynamic_cast<models::Model&>(*fsdp.module());
    torch::NoGradGuard no_grad;
    const at::Tensor out = fsdp.forward([&] { return model.forward(x); });
    const double diff = (out - expected).abs().max().item<double>() / expected.abs().max().item<double>();
    EXPECT_LE(diff, kTolerance) << "rank " << rank;
    for (const UnitInfo& u : fsdp.units()) EXPECT_EQ(u.gathered_bytes, 0) << u.name;
  };
  train_fsdp(run, problem);
}

// no_sync: two micro-batches per step (the first without communication)
// equal one step on the whole batch, with one reduce-scatter per unit per step.
TEST(FsdpNoSync, AccumulationEqualsOneBiggerBatch) {
  const int steps = 8;
  const Problem problem = ddp::testing::make_problem(steps, 24, /*seed=*/7);
  const Snapshot oracle = train_oracle(ModelKind::kMlp, problem, kSeed, {.opt = Opt::kAdam});
  FsdpRun run;
  run.world = 2;
  run.opt = Opt::kAdam;
  run.accumulate = 2;
  run.fsdp.unit_min_params = 0;
  const auto ranks = train_fsdp(run, problem);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(ddp::testing::max_relative_diff(ranks[r].params, oracle), kTolerance) << "rank " << r;
    EXPECT_EQ(ranks[r].stats.reduce_scatters, steps * 3) << "rank " << r;
  }
  // Negative control: the same rows in half-size batches, each synchronized
  // and stepped on alone, are far from the big-batch oracle. (Same generator
  // and element count: make_problem gives the same rows in the same order.)
  const Problem halves = ddp::testing::make_problem(steps * 2, 12, /*seed=*/7);
  FsdpRun separate = run;
  separate.accumulate = 1;
  EXPECT_GT(ddp::testing::max_relative_diff(train_fsdp(separate, halves)[0].params, oracle), 1e-3);
}

// Clipping the sharded gradient equals clipping the whole model's gradient:
// the same norm every step and the same parameters after training.
TEST(FsdpClip, EqualsUnshardedClipping) {
  const int steps = 10;
  const double max_norm = 0.3;
  const Problem problem = ddp::testing::make_problem(steps, 12, /*seed=*/7);
  std::vector<double> norms;
  const Snapshot oracle = train_oracle(ModelKind::kMlp, problem, kSeed, {.clip = max_norm, .norms = &norms});
  const Snapshot unclipped = ddp::testing::train_single_process(ModelKind::kMlp, problem, kSeed);
  FsdpRun run;
  run.world = 3;
  run.clip = max_norm;
  run.fsdp.unit_min_params = 1500;
  const auto ranks = train_fsdp(run, problem);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(ddp::testing::max_relative_diff(ranks[r].params, oracle), kTolerance) << "rank " << r;
    ASSERT_EQ(ranks[r].norms.size(), norms.size());
    for (std::size_t s = 0; s < norms.size(); ++s) EXPECT_NEAR(ranks[r].norms[s], norms[s], 1e-5 * norms[s]);
  }
  // Clipping was active: the clipped oracle differs from the unclipped one.
  EXPECT_GT(norms.front(), max_norm);
  EXPECT_GT(ddp::testing::max_relative_diff(oracle, unclipped), 1e-3);
}

// ZeRO-Offload (FsdpOptions::offload): the optimizer steps host copies of
// the shard pieces. On CPU tensors the kernels are the same, so bitwise the
// run without offload, with Adam, clipping and gradient accumulation.
TEST(FsdpOffload, EqualsTheUnoffloadedRunBitwise) {
  const Problem problem = ddp::testing::make_problem(10, 12, /*seed=*/7);
  FsdpRun run;
  run.world = 2;
  run.opt = Opt::kAdam;
  run.clip = 0.3;
  run.accumulate = 2;
  run.fsdp.unit_min_params = 1500;
  const auto plain = train_fsdp(run, problem);
  run.fsdp.offload = true;
  const auto offloaded = train_fsdp(run, problem);
  for (int r = 0; r < run.world; ++r) {
    EXPECT_EQ(ddp::testing::max_relative_diff(offloaded[r].params, plain[r].params), 0.0) << "rank " << r;
    EXPECT_EQ(offloaded[r].norms, plain[r].norms) << "rank " << r;
  }
}

// With offload the optimizer's parameters are copies: what a checkpoint
// loader writes into the slots (the shards) reaches them through
// after_load(), which the strategy's after_load() calls. Control: before it
// they differ.
TEST(FsdpOffload, CopiesFollowWhatALoaderWrites) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kMlp, kSeed);
    FsdpOptions options = with_units(1500);
    options.offload = true;
    FullyShardedDataParallel fsdp(model, group, options);
    const auto params = fsdp.optimizer_params();
    const auto slots = fsdp.parameter_slots();
    ASSERT_EQ(params.size(), slots.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_FALSE(params[i].is_same(slots[i].local));
      EXPECT_TRUE(torch::equal(params[i], slots[i].local)) << slots[i].name;
      torch::NoGradGuard no_grad;
      slots[i].local.copy_(torch::arange(slots[i].flat_offset, slots[i].flat_offset + slots[i].local.numel(),
                                         torch::kFloat));
      EXPECT_FALSE(torch::equal(params[i], slots[i].local)) << slots[i].name;
    }
    fsdp.after_load();
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::equal(params[i], slots[i].local)) << slots[i].name << " on rank " << group.rank();
  });
}

// Checkpoint slots: every rank's slots tile each parameter exactly once, and
// the slot's local tensor is the optimizer's parameter.
TEST(FsdpSlots, TileEveryParameterOnce) {
  const int world = 3;
  std::vector<std::vector<TensorSlot>> slots(world);
  std::vector<Snapshot> full(world);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kCnn, kSeed + group.rank());
    FullyShardedDataParallel fsdp(model, group, with_units(300));
    slots[group.rank()] = fsdp.parameter_slots();
    const auto params = fsdp.optimizer_params();
    ASSERT_EQ(params.size(), slots[group.rank()].size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].is_same(slots[group.rank()][i].local));
    }
    full[group.rank()] = fsdp.full_parameters();
  });
  for (const auto& [name, value] : full[0]) {
    at::Tensor rebuilt = torch::full({value.numel()}, std::nan(""));
    for (int r = 0; r < world; ++r) {
      for (const TensorSlot& s : slots[r]) {
        if (s.name != name) continue;
        EXPECT_EQ(s.global_shape, value.sizes().vec());
        rebuilt.narrow(0, s.flat_offset, s.local.numel()).copy_(s.local.detach());
      }
    }
    EXPECT_TRUE(torch::equal(rebuilt, value.reshape({-1}))) << name;
  }
  // Construction took rank 0's values: all ranks agree.
  EXPECT_LE(ddp::testing::max_relative_diff(full[1], full[0]), 0.0);
}

}  // namespace
}  // namespace paratrain::fsdp::testing

namespace paratrain::fsdp::testing {
namespace {

// A work whose wait() completes the real collective, then reports failure
// (as a timeout would, with the backend possibly still writing).
class FailingWork final : public comm::Work {
 public:
  explicit FailingWork(comm::WorkHandle inner) : inner_(std::move(inner)) {}
  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    throw TimeoutError("test: all_gather timed out on purpose");
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  comm::WorkHandle inner_;
};

// Forwards every call to `inner`; the all_gather number `fail_at` (counting
// from 1, the same on every rank) throws CommError instead, or with
// `on_wait` returns a work whose wait() throws TimeoutError.
class FailingGatherGroup final : public paratrain::testing::ForwardingGroup {
 public:
  FailingGatherGroup(comm::ProcessGroup& inner, int fail_at, bool on_wait)
      : ForwardingGroup(inner), fail_at_(fail_at), on_wait_(on_wait) {}
  comm::WorkHandle all_gather(at::Tensor& out, const at::Tensor& in) override {
    const bool fail = ++calls_ == fail_at_;
    if (fail && !on_wait_) throw CommError("test: all_gather failed on purpose");
    auto work = inner().all_gather(out, in);
    return fail ? std::make_shared<FailingWork>(work) : work;
  }

 private:
  int fail_at_;
  bool on_wait_;
  int calls_ = 0;
};

// A gather fails inside an operation of forward, where RecordFunction would
// swallow the exception: the operation reads zeros (not freed memory), and
// the error surfaces from loss.backward() with its type. The next step
// gathers afresh and trains normally.
TEST(FsdpErrors, GatherFailureInForwardSurfacesFromBackward) {
  for (bool on_wait : {false, true}) {
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& world_group) {
      FailingGatherGroup group(world_group, /*fail_at=*/2, on_wait);
      auto model = ddp::testing::make_model(ModelKind::kMlp, kSeed);
      FullyShardedDataParallel fsdp(model, group, with_units(0));
      auto opt = make_optimizer(Opt::kSgd, fsdp.optimizer_params());
      const at::Tensor x = torch::ones({4, 64});
      const at::Tensor y = torch::zeros({4}, torch::kLong);
      auto run_step = [&] {
        fsdp.prepare_forward();
        auto loss = torch::nn::functional::cross_entropy(dynamic_cast<models::Model&>(*model).forward(x), y);
        opt->zero_grad();
        loss.backward();
        fsdp.finish_backward();
        fsdp.step(*opt);
      };
      EXPECT_THROW(run_step(), CommError) << "on_wait " << on_wait;  // TimeoutError is a CommError
      for (const UnitInfo& u : fsdp.units()) EXPECT_EQ(u.gathered_bytes, 0) << u.name;
      run_step();  // recovers
      const auto full = fsdp.full_parameters();
      for (const auto& [name, value] : full) EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
    });
  }
}

}  // namespace
}  // namespace paratrain::fsdp::testing

namespace paratrain::fsdp::testing {
namespace {

// Engines come and go on one thread: the operation observer is released with
// the last engine and registered again for the next, which still gathers on
// touch (its forward would read freed memory otherwise) and reduces.
TEST(FsdpLifetime, EnginesOneAfterAnotherOnOneThread) {
  paratrain::testing::run_ranks(2, [](comm::ProcessGroup& group) {
    for (int round = 0; round < 2; ++round) {
      auto model = ddp::testing::make_model(ModelKind::kMlp, kSeed);
      FullyShardedDataParallel fsdp(model, group, with_units(0));
      fsdp.prepare_forward();
      dynamic_cast<models::Model&>(*model).forward(torch::ones({2, 64})).sum().backward();
      EXPECT_EQ(fsdp.stats().reduce_scatters, 3) << "round " << round;
      for (const at::Tensor& piece : fsdp.optimizer_params()) EXPECT_TRUE(piece.grad().defined());
      for (const UnitInfo& u : fsdp.units()) EXPECT_EQ(u.gathered_bytes, 0) << u.name;
    }
  });
}

}  // namespace
}  // namespace paratrain::fsdp::testing
