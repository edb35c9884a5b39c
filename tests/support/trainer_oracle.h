// The small Trainer oracle shared by the backend tests (tests/mpi,
// tests/shm): an MLP run on synthetic data that one process and N ranks
// can both train from the same seed and global batch, and the comparison of
// their parameters. Header-only: only tests linking paratrain_train use it.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace paratrain::testing {

using Params = std::vector<std::pair<std::string, at::Tensor>>;

// 20 AdamW steps of a 64-32 MLP on 8x8 synthetic images, global batch 32.
inline train::TrainConfig mlp_oracle_config(const std::string& output_dir, const std::string& name,
                                            int64_t zero_stage) {
  train::TrainConfig c;
  c.run.name = name;
  c.run.output_dir = output_dir;
  c.run.seed = 5;
  c.run.log_every = 10;
  c.model.kind = "mlp";
  c.model.hidden = {64, 32};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 640;
  c.data.synthetic_test_size = 64;
  c.data.synthetic_image_size = 8;
  c.data.global_batch_size = 32;
  c.optimizer.kind = "adamw";
  c.optimizer.lr = 0.01;
  c.train.epochs = 1;
  c.train.max_steps = 20;
  c.train.eval_every_epochs = 0;
  c.zero.stage = zero_stage;
  return c;
}

inline Params train_on(const train::TrainConfig& c, comm::ProcessGroup& group) {
  train::Trainer t(c, group);
  t.fit();
  return t.full_parameters();
}

// Rank 0's parameters after training `c` on `world` ranks (threads).
inline Params train_ranks(const train::TrainConfig& c, int world) {
  Params out;
  run_ranks(world, [&](comm::ProcessGroup& g) {
    Params p = train_on(c, g);
    if (g.rank() == 0) out = std::move(p);
  });
  return out;
}

// The same run on one process (a one-rank Gloo group of its own).
inline Params one_process(const train::TrainConfig& c) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = comm::make_gloo_group(store, 0, 1, comm::GlooOptions{});
  return train_on(c, *group);
}

// max over parameters of max|a - b| / max|b|.
inline double relative_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const at::Tensor x = a[i].second.to(at::kDouble), y = b[i].second.to(at::kDouble);
    worst = std::max(worst, (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

}  // namespace paratrain::testing
