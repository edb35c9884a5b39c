// Test helpers for DDP: see training.h.
#include "tests/ddp/training.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "paratrain/data_parallel/ddp/naive.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/mlp.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::ddp::testing {
namespace {

constexpr int64_t kImage = 8;
constexpr int64_t kClasses = 10;

at::Tensor rows(const at::Tensor& t, int64_t start, int64_t count) { return t.narrow(0, start, count); }

}  // namespace

const char* to_string(ModelKind kind) { return kind == ModelKind::kMlp ? "Mlp" : "Cnn"; }

std::shared_ptr<models::Model> make_model(ModelKind kind, uint64_t seed) {
  return paratrain::testing::seeded(seed, [kind]() -> std::shared_ptr<models::Model> {
    if (kind == ModelKind::kMlp) {
      return models::make_mlp({.in_features = kImage * kImage, .hidden = {32, 32}, .out_features = kClasses});
    }
    return models::make_cnn({.in_channels = 1, .image_size = kImage, .num_classes = kClasses,
                             .channels = {4, 8}, .hidden = 16});
  });
}

at::Tensor Problem::batch_inputs(int step) const { return rows(inputs, step * global_batch, global_batch); }
at::Tensor Problem::batch_targets(int step) const { return rows(targets, step * global_batch, global_batch); }

Problem make_problem(int steps, int64_t global_batch, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  Problem p;
  p.steps = steps;
  p.global_batch = global_batch;
  p.inputs = torch::randn({steps * global_batch, 1, kImage, kImage}, gen);
  p.targets = torch::randint(0, kClasses, {steps * global_batch}, gen, torch::kLong);
  return p;
}

at::Tensor shard(const at::Tensor& batch, int rank, int world) {
  const int64_t n = batch.size(0);
  TORCH_CHECK(n % world == 0, "batch of ", n, " rows does not split over ", world, " ranks");
  return rows(batch, rank * (n / world), n / world);
}

Snapshot snapshot(torch::nn::Module& module) {
  Snapshot out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

Snapshot train_single_process(ModelKind kind, const Problem& problem, uint64_t seed, SgdConfig sgd) {
  auto model = make_model(kind, seed);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(sgd.lr).momentum(sgd.momentum));
  for (int step = 0; step < problem.steps; ++step) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(problem.batch_inputs(step)),
                                                     problem.batch_targets(step));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return snapshot(*model);
}

std::vector<Snapshot> train_ranks(const RankRun& run, const Problem& problem) {
  std::vector<Snapshot> result(run.world);
  paratrain::testing::run_ranks(run.world, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    auto model = make_model(run.model, run.seed + (run.different_seeds ? rank : 0));
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<NaiveDataParallel> naive;
    if (run.sync == Sync::kDdp) {
      DdpOptions options = run.ddp;
      std::function<void(DistributedDataParallel&)> after;
      if (run.per_rank) after = run.per_rank(options);
      ddp = std::make_unique<DistributedDataParallel>(model, group, options);
      if (after) after(*ddp);
    }
    if (run.sync == Sync::kNaive) naive = std::make_unique<NaiveDataParallel>(model, group);
    torch::optim::SGD opt(model->parameters(),
                          torch::optim::SGDOptions(run.sgd.lr).momentum(run.sgd.momentum));
    for (int step = 0; step < problem.steps; ++step) {
      if (ddp) ddp->prepare_forward();
      if (naive) naive->prepare_forward();
      auto x = shard(problem.batch_inputs(step), rank, run.world);
      auto y = shard(problem.batch_targets(step), rank, run.world);
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      if (naive) naive->sync_gradients();
      opt.step();
    }
    result[rank] = snapshot(*model);
  });
  return result;
}

DdpOptions with_caps(int64_t first_bucket_cap, int64_t bucket_cap) {
  DdpOptions o;
  o.reducer.buckets.first_bucket_cap_bytes = first_bucket_cap;
  o.reducer.buckets.bucket_cap_bytes = bucket_cap;
  return o;
}

double max_relative_diff(const Snapshot& a, const Snapshot& b) {
  TORCH_CHECK(a.size() == b.size(), "snapshots have ", a.size(), " and ", b.size(), " tensors");
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    TORCH_CHECK(a[i].first == b[i].first, "tensor ", i, " is '", a[i].first, "' vs '", b[i].first, "'");
    const double scale = b[i].second.abs().max().item<double>();
    const double diff = (a[i].second - b[i].second).abs().max().item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  if (std::getenv("DDP_TEST_PRINT")) std::fprintf(stderr, "max_relative_diff = %.3g\n", worst);
  return worst;
}

bool identical(const Snapshot& a, const Snapshot& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !torch::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

}  // namespace paratrain::ddp::testing
