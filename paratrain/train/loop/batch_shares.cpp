// Speed-weighted data parallelism (batch_shares.h).
#include "paratrain/train/loop/batch_shares.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/train/strategies/strategy_registry.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

std::vector<int64_t> resolve_batch_shares(const TrainConfig& config, int64_t per_rank, int dp) {
  const auto& shares = config.data.batch_shares;
  if (shares.empty()) return {};
  if (config.data.auto_shares()) return std::vector<int64_t>(static_cast<size_t>(dp), per_rank);
  if (static_cast<int64_t>(shares.size()) != dp && !config.train.resume.empty()) {
    // An elastic restart at another world size (train.resume set by it):
    // the job goes on, at equal shares, rather than dying on its own config.
    spdlog::warn("data.batch_shares = [{}] has {} entries but the data-parallel group has {} ranks now; this "
                 "resumed run uses equal shares (set a vector for {} ranks, or \"auto\")",
                 fmt::join(shares, ", "), shares.size(), dp, dp);
    return std::vector<int64_t>(static_cast<size_t>(dp), per_rank);
  }
  if (static_cast<int64_t>(shares.size()) != dp) {
    throw ConfigError(fmt::format(
        "data.batch_shares = [{}] has {} entries but the data-parallel group has {} ranks: give one share per dp "
        "rank, or \"auto\"",
        fmt::join(shares, ", "), shares.size(), dp));
  }
  return data::split_by_shares(per_rank * dp, shares);
}

std::unique_ptr<data::Loader> make_train_loader(const Trainer::State& s) {
  const auto& c = s.config;
  const DataShard shard = s.strategy->data_shard();
  data::SamplerOptions sampler;
  sampler.num_replicas = shard.size;
  sampler.rank = shard.rank;
  sampler.shuffle = c.data.shuffle;
  sampler.seed = static_cast<uint64_t>(c.run.seed);
  sampler.drop_last = c.data.drop_last;
  sampler.shares = s.batch.shares;
  // A mixture-of-experts model gives slots in the order of one process's
  // batch (Note [Routing as one process would], moe/moe.h), which it reads
  // as the dp ranks' tokens in rank order: consecutive runs of each global
  // batch (Note [Shared global batches]) rather than the strided split. The
  // global batches are the same either way. In pipeline stages each of the
  // pipeline's m micro-batches routes its own tokens, as one process's
  // accumulated micro-batch does: read as global batches of their own, rank
  // r's batch is its runs of m consecutive global micro-batches, so the dp
  // ranks' micro-batch i is one process's micro-batch i (the loader's
  // batch then holds m runs).
  if (sampler.shares.empty() && c.model.moe_experts > 0) {
    const int64_t m = c.parallel.pp > 1 ? c.pipeline.microbatches : 1;
    // The pipeline's shape check refused a batch m does not divide.
    TORCH_CHECK(s.batch.per_rank % m == 0, "a batch of ", s.batch.per_rank, " rows in ", m, " micro-batches");
    sampler.shares.assign(static_cast<size_t>(shard.size), s.batch.per_rank / m);
  }
  data::LoaderOptions loader;
  loader.batch_size = s.batch.shares.empty() ? s.batch.per_rank : s.batch.shares.at(static_cast<size_t>(shard.rank));
  loader.drop_last = c.data.drop_last;
  loader.prefetch_depth = static_cast<int>(c.data.prefetch);
  return std::make_unique<data::Loader>(s.datasets.train, data::DistributedSampler(s.datasets.train.size(), sampler),
                                        loader);
}

void apply_batch_shares(Trainer::State& s, std::vector<int64_t> shares) {
  const data::LoaderState at = s.loader->state();
  s.batch.shares = std::move(shares);
  auto loader = make_train_loader(s);
  loader->load_state(at);
  s.loader = std::move(loader);
}

at::Tensor evaluation_rows(const std::vector<int64_t>& shares, int rank, int dp, int64_t test_size,
                           int64_t& most_rows) {
  if (shares.empty() || test_size < dp) {
    // Strided, without padding: shares differ by at most one row.
    most_rows = (test_size + dp - 1) / dp;
    return torch::arange(rank, test_size, dp, torch::kLong);
  }
  const auto sizes = data::split_by_shares(test_size, std::vector<double>(shares.begin(), shares.end()));
  most_rows = *std::max_element(sizes.begin(), sizes.end());
  const int64_t first = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
  return torch::arange(first, first + sizes[static_cast<size_t>(rank)], torch::kLong);
}

std::vector<int64_t> rebalanced_shares(const std::vector<int64_t>& shares, const std::vector<double>& seconds_per_example,
                                       double max_change) {
  const int64_t total = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  double speed_sum = 0;
  for (double t : seconds_per_example) {
    if (!(t > 0) || !std::isfinite(t)) return shares;  // a rank measured nothing
    speed_sum += 1.0 / t;
  }
  std::vector<double> wanted(shares.size());
  for (size_t r = 0; r < shares.size(); ++r) {
    const double target = static_cast<double>(total) / seconds_per_example[r] / speed_sum;
    const auto now = static_cast<double>(shares[r]);
    wanted[r] = std::clamp(target, now * (1 - max_change), now * (1 + max_change));
  }
  const auto moved = data::split_by_shares(total, wanted);
  auto slowest = [&](const std::vector<int64_t>& sizes) {
    double most = 0;
    for (size_t r = 0; r < sizes.size(); ++r) most = std::max(most, static_cast<double>(sizes[r]) * seconds_per_example[r]);
    return most;
  };
  return slowest(moved) < 0.97 * slowest(shares) ? moved : shares;
}

ShareBalancer::ShareBalancer(Trainer::State& s) : s_(s), pipelined_(strategy_name(s.config) == "pipeline") {}

double ShareBalancer::loss_weight() const {
  const auto& shares = s_.batch.shares;
  if (shares.empty()) return 1.0;
  const int64_t total = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  const int rank = s_.strategy->data_shard().rank;
  return static_cast<double>(shares.at(static_cast<size_t>(rank)) * static_cast<int64_t>(shares.size())) /
         static_cast<double>(total);
}

int64_t ShareBalancer::own_batch() const {
  const auto& shares = s_.batch.shares;
  return shares.empty() ? s_.batch.per_rank : shares.at(static_cast<size_t>(s_.strategy->data_shard().rank));
}

void ShareBalancer::begin_micro_batch() {
  micro_start_ = Clock::now();
  micro_collective_ = comm::thread_collective_seconds();
}

void ShareBalancer::end_micro_batch(int64_t examples) {
  auto compute = [&] {
    const double wall = std::chrono::duration<double>(Clock::now() - micro_start_).count();
    return std::max(wall - (comm::thread_collective_seconds() - micro_collective_), 0.0);
  };
  // Experiments and tests: a compute cost per example, and a rank factor
  // times slower per example, on purpose.
  const ProfileConfig& p = s_.config.profile;
  // The pipeline strategy slows its stage compute inside the schedule
  // (pipeline::ExecutorOptions::compute_slowdown), between sends and receives.
  const bool slowed = p.test_slow_factor > 1 && p.test_slow_rank == s_.world->rank() && !pipelined_;
  const double factor = slowed ? p.test_slow_factor : 1.0;
  const double sleep_s = (factor - 1) * compute() + factor * p.test_example_ms * 1e-3 * static_cast<double>(examples);
  if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  compute_s_ += compute();
  examples_ += examples;
}

void ShareBalancer::begin_step() {
  step_start_ = Clock::now();
  step_collective_ = comm::thread_collective_seconds();
}

void ShareBalancer::end_step() {
  step_s_ += std::chrono::duration<double>(Clock::now() - step_start_).count();
  waited_s_ += comm::thread_collective_seconds() - step_collective_;
  ++steps_;
}

void ShareBalancer::at_step_end() {
  const DataConfig& d = s_.config.data;
  if (d.batch_shares.empty() || s_.step % d.rebalance_every_steps != 0 || steps_ == 0) return;
  comm::ProcessGroup& dp = s_.dp();
  auto mine = torch::tensor({compute_s_, waited_s_, step_s_, static_cast<double>(examples_),
                             static_cast<double>(steps_)},
                            torch::kDouble);
  auto all = torch::empty({dp.size() * mine.numel()}, torch::kDouble);
  dp.all_gather(all, mine)->wait(s_.timeout());
  compute_s_ = waited_s_ = step_s_ = 0;
  examples_ = steps_ = 0;
  const auto rows = all.view({dp.size(), mine.numel()});
  std::vector<double> per_example, compute_ms, waited_ms, step_ms;
  for (int r = 0; r < dp.size(); ++r) {
    const auto row = rows[r];
    const double steps = std::max(row[4].item<double>(), 1.0);
    per_example.push_back(row[0].item<double>() / std::max(row[3].item<double>(), 1.0));
    compute_ms.push_back(1e3 * row[0].item<double>() / steps);
    step_ms.push_back(1e3 * row[2].item<double>() / steps);
    waited_ms.push_back(1e3 * row[1].item<double>() / steps);
  }
  const std::vector<int64_t> before = s_.batch.shares;
  std::vector<int64_t> after = before;
  if (d.auto_shares()) {
    // Decided on dp rank 0 and broadcast: mixed hardware may round floats
    // differently, and every rank must cut the same batch.
    after = rebalanced_shares(before, per_example, d.rebalance_max_change);
    auto decided = torch::tensor(after, torch::kLong);
    dp.broadcast(decided, 0)->wait(s_.timeout());
    after.assign(decided.data_ptr<int64_t>(), decided.data_ptr<int64_t>() + decided.numel());
  }
  if (s_.is_main()) {
    auto ms = [](const std::vector<double>& v, double scale) {
      std::vector<std::string> out;
      for (double x : v) out.push_back(fmt::format("{:.3g}", x * scale));
      return fmt::format("[{}]", fmt::join(out, ", "));
    };
    spdlog::info("step {}: batch shares [{}]{}: compute {} ms/step, {} ms/example, in collectives {} ms/step per rank",
                 s_.step, fmt::join(before, ", "),
                 after == before ? std::string() : fmt::format(" -> [{}]", fmt::join(after, ", ")), ms(compute_ms, 1),
                 ms(per_example, 1e3), ms(waited_ms, 1));
  }
  s_.log_record({{"kind", "balance"}, {"step", s_.step}, {"shares", before}, {"new_shares", after},
                 {"compute_ms", compute_ms}, {"collective_ms", waited_ms}, {"step_ms", step_ms}, {"ms_per_example", [&] {
                    std::vector<double> v;
                    for (double t : per_example) v.push_back(1e3 * t);
                    return v;
                  }()}});
  if (after != before) apply_batch_shares(s_, std::move(after));
}

}  // namespace paratrain::train
