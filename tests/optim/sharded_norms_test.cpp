// LARS and LAMB on ZeRO-style shards (ranks as threads): each tensor's flat
// elements are split over 2 ranks, as ZeRO-1 partitions them (a tiny tensor
// may live on one rank only), each rank's optimizer holds only its pieces and
// completes the trust-ratio norms with sharded_norm_reducer (one all-reduce
// per step). Oracle: the same optimizer on the whole tensors in one process.
//
// Tolerance: 1e-6 relative on each piece's update over 3 steps, in float64
// (the norms are the same sums of squares in another order; measured ~1e-15).
// Negative control: without the reducer each rank's ratios use its pieces'
// norms only and the updates miss the oracle by more than 0.05.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <mutex>

#include "paratrain/comm/process_group.h"
#include "paratrain/optim/lamb.h"
#include "paratrain/optim/lars.h"
#include "tests/optim/optim_testing.h"
#include "tests/support/multi_rank.h"

namespace paratrain::optim {
namespace {

using namespace optim::testing;
constexpr int kWorld = 2;
constexpr int kSteps = 3;

// W1 [4,3] (12 elements: 6 + 6), b1 [4] (2 + 2), W2 [2,4] (8: 4 + 4), and a
// 1-element bias held by rank 0 only, so rank 1 has no piece of it.
std::vector<at::Tensor> full_params() {
  auto params = make_params(21);
  params[3] = at::randn({1}, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  return params;
}

struct Piece {
  std::size_t tensor;
  int64_t offset, numel;
};

std::vector<Piece> pieces_of(const std::vector<at::Tensor>& params, int rank) {
  std::vector<Piece> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel(), half = (n + 1) / 2;
    const int64_t begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
    if (end > begin) out.push_back({i, begin, end - begin});
  }
  return out;
}

enum class Kind { kLars, kLamb };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind, const ParamSplit& split) {
  if (kind == Kind::kLars) {
    const auto o = LarsOptions(1.0).momentum(0.9).weight_decay(1e-2).trust_coefficient(0.02);
    return std::make_unique<Lars>(lars_param_groups(split, o), o);
  }
  const auto o = LambOptions(0.05).weight_decay(1e-2);
  return std::make_unique<Lamb>(lamb_param_groups(split, o), o);
}

void set_reducer(torch::optim::Optimizer& opt, Kind kind, NormReducer reducer) {
  if (kind == Kind::kLars) static_cast<Lars&>(opt).set_norm_reducer(std::move(reducer));
  else static_cast<Lamb&>(opt).set_norm_reducer(std::move(reducer));
}

// Worst relative update diff of every rank's pieces against the oracle.
double sharded_vs_oracle(Kind kind, bool with_reducer) {
  // Oracle: whole tensors, one process.
  auto oracle = full_params();
  const auto start = detached_copies(oracle);
  auto whole = make_optimizer(kind, split_for_adaptation(oracle));
  for (int s = 0; s < kSteps; ++s) {
    set_grads(oracle, make_grads(oracle, s));
    whole->step();
  }

  std::mutex mu;
  double worst = 0;
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    const auto pieces = pieces_of(start, group.rank());
    std::vector<at::Tensor> params;
    std::vector<int64_t> full_dims;
    std::vector<std::pair<at::Tensor, int64_t>> owners;
    for (const Piece& p : pieces) {
      params.push_back(start[p.tensor].flatten().narrow(0, p.offset, p.numel).clone().requires_grad_());
      full_dims.push_back(start[p.tensor].dim());
      owners.emplace_back(params.back(), static_cast<int64_t>(p.tensor));
    }
    auto opt = make_optimizer(kind, split_for_adaptation(params, full_dims));
    if (with_reducer) set_reducer(*opt, kind, sharded_norm_reducer(group, owners, static_cast<int64_t>(start.size())));
    for (int s = 0; s < kSteps; ++s) {
      const auto grads = make_grads(start, s);  // the full gradients; each rank takes its slices
      for (std::size_t k = 0; k < pieces.size(); ++k)
        params[k].mutable_grad() =
            grads[pieces[k].tensor].flatten().narrow(0, pieces[k].offset, pieces[k].numel).clone();
      opt->step();
    }
    double local = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const auto slice = [&](const at::Tensor& t) {
        return t.detach().flatten().narrow(0, pieces[k].offset, pieces[k].numel);
      };
      const at::Tensor before = slice(start[pieces[k].tensor]);
      local = std::max(local, relative_diff(params[k].detach() - before, slice(oracle[pieces[k].tensor]) - before));
    }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, local);
  });
  return worst;
}

TEST(ShardedNormsTest, LarsOnShardsMatchesWholeTensors) {
  const double diff = sharded_vs_oracle(Kind::kLars, true);
  EXPECT_LE(diff, 1e-6);
  RecordProperty("update_diff", sci(diff));
  const double local_only = sharded_vs_oracle(Kind::kLars, false);
  EXPECT_GT(local_only, 0.05) << "negative control: local norms only";
  RecordProperty("negative_control_diff", sci(local_only));
}

TEST(ShardedNormsTest, LambOnShardsMatchesWholeTensors) {
  const double diff = sharded_vs_oracle(Kind::kLamb, true);
  EXPECT_LE(diff, 1e-6);
  RecordProperty("update_diff", sci(diff));
  const double local_only = sharded_vs_oracle(Kind::kLamb, false);
  EXPECT_GT(local_only, 0.05) << "negative control: local norms only";
  RecordProperty("negative_control_diff", sci(local_only));
}

// One collective per step, and a rank that holds nothing (empty param groups)
// still joins it: otherwise its peer would wait for the all-reduce until the
// group timeout (10 s here) and the test would fail with TimeoutError.
TEST(ShardedNormsTest, OneReductionPerStepAlsoOnARankWithNoPieces) {
  const std::vector<at::Tensor> start{at::tensor({{3.0}, {-4.0}}, at::kDouble), at::tensor({{2.0}}, at::kDouble)};
  const std::vector<at::Tensor> grads{at::tensor({{0.1}, {0.2}}, at::kDouble), at::tensor({{-0.5}}, at::kDouble)};
  const auto options = LarsOptions(1.0).momentum(0.9).trust_coefficient(0.02);
  constexpr int kStepsHere = 2;
  auto whole = detached_copies(start);
  for (auto& t : whole) t.requires_grad_();
  Lars oracle(whole, options);
  for (int s = 0; s < kStepsHere; ++s) {
    set_grads(whole, grads);
    oracle.step();
  }

  paratrain::testing::run_ranks(
      kWorld,
      [&](comm::ProcessGroup& group) {
        // Rank 0 holds both tensors whole (as flat pieces), rank 1 nothing.
        std::vector<at::Tensor> params;
        std::vector<std::pair<at::Tensor, int64_t>> owners;
        if (group.rank() == 0) {
          for (std::size_t i = 0; i < start.size(); ++i) {
            params.push_back(start[i].flatten().clone().requires_grad_());
            owners.emplace_back(params.back(), static_cast<int64_t>(i));
          }
        }
        Lars opt(lars_param_groups(split_for_adaptation(params, std::vector<int64_t>(params.size(), 2)), options),
                 options);
        const NormReducer inner = sharded_norm_reducer(group, owners, static_cast<int64_t>(start.size()));
        int calls = 0;
        opt.set_norm_reducer([&](const std::vector<at::Tensor>& ps, at::Tensor& sums) {
          ++calls;
          inner(ps, sums);
        });
        for (int s = 0; s < kStepsHere; ++s) {
          for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].flatten().clone();
          opt.step();
        }
        EXPECT_EQ(calls, kStepsHere) << "rank " << group.rank();
        for (std::size_t i = 0; i < params.size(); ++i) {
          const at::Tensor before = start[i].flatten();
          EXPECT_LE(relative_diff(params[i].detach() - before, whole[i].detach().flatten() - before), 1e-12)
              << "tensor " << i;
        }
      },
      std::chrono::seconds(10));
}

TEST(ShardedNormsTest, ReducerRejectsUnknownParams) {
  paratrain::testing::run_ranks(1, [](comm::ProcessGroup& group) {
    auto known = at::ones({2}, at::kDouble);
    auto stranger = at::ones({2}, at::kDouble);
    const NormReducer reducer = sharded_norm_reducer(group, {{known, 0}}, 1);
    at::Tensor sums = at::ones({1, 2}, at::kDouble);
    EXPECT_THROW(reducer({stranger}, sums), c10::Error);
    reducer({known}, sums);
    EXPECT_TRUE(at::equal(sums, at::ones({1, 2}, at::kDouble)));
  });
}

}  // namespace
}  // namespace paratrain::optim
