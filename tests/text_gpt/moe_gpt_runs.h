// The mixture-of-experts GPT runs the MoE tests share
// (moe_gpt_trainer_test.cpp, moe_gpt_stages_test.cpp): the small config
// and a run on ranks as threads that reports what each rank held.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "paratrain/models/gpt.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train::moe_gpt {

using paratrain::testing::Params;
using paratrain::testing::relative_diff;

inline TrainConfig moe_config(const std::string& dir, const std::filesystem::path& corpus, const std::string& name) {
  TrainConfig c = paratrain::testing::tiny_gpt_config(dir, corpus);
  c.run.name = name;
  c.model.layers = 2;
  c.data.global_batch_size = 8;  // one process's batch, split over the ranks
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity_factor = 0.75;  // drops: each expert takes 3/8 of a step's token pairs at most
  c.model.moe_every = 2;               // block 1's MLP
  c.model.moe_aux_loss = 0.05;
  c.train.max_steps = 6;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  return c;
}

// Runs `c` on `world` ranks; rank 0's gathered parameters (checked equal
// to every other rank's: each ep group's experts and the replicas agree),
// and how many experts of the first MoE layer and parameters each rank
// held.
struct EpRun {
  Params params;
  std::vector<int64_t> experts, parameters;
};
inline EpRun train_ep(const TrainConfig& c, int world) {
  std::vector<Params> all(static_cast<size_t>(world));
  std::vector<int64_t> held(static_cast<size_t>(world), 0), numel(static_cast<size_t>(world), 0);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    Trainer t(c, g);
    t.fit();
    held[static_cast<size_t>(g.rank())] = models::moe_layers(*t.model()).front().second->local_experts();
    for (const auto& p : t.model()->parameters()) numel[static_cast<size_t>(g.rank())] += p.numel();
    all[static_cast<size_t>(g.rank())] = t.full_parameters();
  });
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(relative_diff(all[static_cast<size_t>(r)], all[0]), 0) << "rank " << r << " differs from rank 0";
  }
  return {all[0], held, numel};
}

}  // namespace paratrain::train::moe_gpt
