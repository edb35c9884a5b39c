// Speed-weighted data parallelism (data.batch_shares, docs/heterogeneous.md):
// which micro-batch size each dp rank computes, the weight of its loss, the
// measurement of each rank's compute and waiting, and "auto" rebalancing.
// Not the sampler's layout (Note [Shared global batches] in
// data/sampler.cpp) nor the loop's cadence (fit_loop.h calls in here).
// Internal to paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/train/trainer.h"

namespace paratrain::data {
class Loader;
}

namespace paratrain::train {

struct TrainConfig;

// Each dp rank's micro-batch size from data.batch_shares for `dp` ranks of
// `per_rank` examples on average (empty when the key is empty; "auto" starts
// equal). A list without one entry per dp rank is a ConfigError, except in a
// resumed run (an elastic restart at another world size): equal shares and
// a warning.
std::vector<int64_t> resolve_batch_shares(const TrainConfig& config, int64_t per_rank, int dp);

// The training loader for s.batch (its shares included), at epoch 0, batch 0.
std::unique_ptr<data::Loader> make_train_loader(const Trainer::State& s);

// New shares from the next step on: s.batch.shares and a loader standing
// where the old one stood (any share vector reads the same global batches).
void apply_batch_shares(Trainer::State& s, std::vector<int64_t> shares);

// The rows of the test set rank `rank` of `dp` evaluates: contiguous runs in
// proportion to `shares`, or the strided split without them; every row once.
// `most_rows` is set to the longest rank's count (every rank runs as many
// forwards: FSDP's is collective).
at::Tensor evaluation_rows(const std::vector<int64_t>& shares, int rank, int dp, int64_t test_size,
                           int64_t& most_rows);

// The shares "auto" moves to: each rank's share of `total` in proportion to
// its speed (1 / seconds per example), each moved by at most `max_change`
// of itself; unchanged unless the slowest rank's predicted compute per step
// drops by more than 3% (measurement noise must not make shares wander).
// The same on every rank for the same inputs.
std::vector<int64_t> rebalanced_shares(const std::vector<int64_t>& shares, const std::vector<double>& seconds_per_example,
                                       double max_change);

// Note [Weighted shares]
// With shares b_0 .. b_{R-1} (sum G per micro-batch), rank r's loss is the
// mean over its b_r examples. Multiplied by w_r = b_r / (G / R) before
// backward, the data-parallel mean (the sum over ranks divided by R, as
// DDP, ZeRO and FSDP reduce) becomes sum_r b_r * mean_r / G: the sum of all
// per-example gradients divided by the global batch once, one process's
// gradient on the same G examples. Accumulation divides each micro-batch by
// k on top, as without shares. The logged loss is weighted the same way
// (LossWindow). Without shares w_r = 1 and nothing changes.
class ShareBalancer {
 public:
  explicit ShareBalancer(Trainer::State& s);

  // w_r of Note [Weighted shares]; 1 without shares.
  double loss_weight() const;
  // This rank's micro-batch size (the mean one without shares).
  int64_t own_batch() const;

  // Around one micro-batch: taking it from the loader, forward and backward
  // (a slow input pipeline is part of a rank's speed). end() applies
  // profile.test_example_ms and test_slow_factor (sleeps counted as compute).
  void begin_micro_batch();
  void end_micro_batch(int64_t examples);
  // Around a whole step (micro-batches and optimizer step): its wall time
  // and the time in collectives, for the waits the log shows.
  void begin_step();
  void end_step();

  // Where every rank stands at s.step (after a step). With data.batch_shares
  // set, every data.rebalance_every_steps steps: gathers each rank's compute
  // and waits over dp, logs them (rank 0's log line, a "balance" record in
  // metrics.jsonl) and under "auto" moves the shares. Collective over dp.
  void at_step_end();

 private:
  Trainer::State& s_;
  bool pipelined_;  // the pipeline strategy applies profile.test_slow_factor itself
  using Clock = std::chrono::steady_clock;
  Clock::time_point micro_start_, step_start_;
  double micro_collective_ = 0, step_collective_ = 0;
  // Sums since the last report.
  double compute_s_ = 0, step_s_ = 0, waited_s_ = 0;
  int64_t examples_ = 0, steps_ = 0;
};

}  // namespace paratrain::train
