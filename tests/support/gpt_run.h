// What the GPT trainer tests share (tests/text_gpt, tests/pipeline): a
// generated corpus, the tiny GPT run they compare layouts on, training it on
// thread-ranks, and the relative difference `paratrain checkpoint compare`
// reports. Header-only: only tests linking paratrain_train use it.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace paratrain::testing {

using Params = std::vector<std::pair<std::string, at::Tensor>>;

// ~12 KB of English-like text from a fixed word list and an LCG started at
// `seed`, so the tests need no corpus on the machine. Returns the file.
inline std::filesystem::path write_word_corpus(const std::filesystem::path& dir, uint32_t seed) {
  static const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to",
                                "big", "red", "house", "in", "sun", "we", "saw", "it", "over", "hill"};
  std::string text;
  uint32_t x = seed;
  while (text.size() < 12000) {
    x = x * 1664525u + 1013904223u;
    text += words[(x >> 16) % 20];
    text += (x >> 8) % 9 == 0 ? ".\n" : " ";
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << text;
  return dir / "corpus.txt";
}

// A tiny GPT (2 layers, d = 32, 4 heads, 16 tokens, dropout 0), global batch
// 8, 10 steps of SGD + momentum + weight decay with gradient clipping (the
// bound is reached, so a norm summed across shards or stages matters). SGD
// puts every gradient linearly into the weights, so comparing weights
// compares gradients (AdamW amplifies rounding: see megatron_trainer_test).
inline train::TrainConfig tiny_gpt_config(const std::string& out, const std::filesystem::path& corpus) {
  train::TrainConfig c;
  c.run.name = "gpt";
  c.run.output_dir = out;
  c.run.seed = 5;
  c.run.log_every = 0;
  c.model.kind = "gpt";
  c.model.layers = 2;
  c.model.d_model = 32;
  c.model.heads = 4;
  c.model.seq_len = 16;
  c.model.dropout = 0.0;
  c.data.dataset = "text";
  c.data.path = corpus.string();
  c.data.batch_size = 8;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0.01;
  c.optimizer.clip_grad_norm = 0.5;
  c.train.epochs = 1;
  c.train.max_steps = 10;
  c.ddp.mode = "bucketed";
  return c;
}

// A layout of the megatron strategy's axes for the tiny GPT, by name:
// "tp2", "tp2_sp" (Megatron-SP), "cp2", "pp2_dp2_zero1", "tp2_pp2",
// "tp2_cp2", "cp2_pp2" (pipelines with 2 micro-batches), "tp2_cp2_zero3"
// (FSDP over the cp ranks, several units).
struct MeshLayout {
  std::string name;
  int world = 1;
  std::function<void(train::TrainConfig&)> apply;
};

inline MeshLayout megatron_layout(const std::string& name) {
  auto stages = [](train::TrainConfig& c) {
    c.parallel.pp = 2;
    c.pipeline.microbatches = 2;
  };
  if (name == "tp2") return {name, 2, [](train::TrainConfig& c) { c.parallel.tp = 2; }};
  if (name == "tp2_sp")
    return {name, 2, [](train::TrainConfig& c) {
              c.parallel.tp = 2;
              c.parallel.megatron_sp = true;
            }};
  if (name == "cp2") return {name, 2, [](train::TrainConfig& c) { c.parallel.cp = 2; }};
  if (name == "pp2_dp2_zero1")
    return {name, 4, [stages](train::TrainConfig& c) {
              stages(c);
              c.zero.stage = 1;
            }};
  if (name == "tp2_pp2")
    return {name, 4, [stages](train::TrainConfig& c) {
              stages(c);
              c.parallel.tp = 2;
            }};
  if (name == "tp2_cp2")
    return {name, 4, [](train::TrainConfig& c) {
              c.parallel.tp = 2;
              c.parallel.cp = 2;
            }};
  if (name == "tp2_cp2_zero3")
    return {name, 4, [](train::TrainConfig& c) {
              c.parallel.tp = 2;
              c.parallel.cp = 2;
              c.zero.stage = 3;
              c.zero.unit_min_params = 3000;
            }};
  if (name == "cp2_pp2")
    return {name, 4, [stages](train::TrainConfig& c) {
              stages(c);
              c.parallel.cp = 2;
            }};
  throw std::invalid_argument("megatron_layout: no layout named " + name);
}

inline std::vector<MeshLayout> megatron_layouts(const std::vector<std::string>& names) {
  std::vector<MeshLayout> out;
  for (const auto& n : names) out.push_back(megatron_layout(n));
  return out;
}

struct RunOutput {
  Params params;
  train::TrainResult result;
};

// Trains `config` on `ranks` thread-ranks; rank 0's full parameters and
// result, after checking that every rank returns the same parameters.
inline RunOutput run_training(const train::TrainConfig& config, int ranks) {
  std::vector<RunOutput> out(ranks);
  run_ranks(ranks, [&](comm::ProcessGroup& g) {
    train::Trainer t(config, g);
    auto r = t.fit();
    out[g.rank()] = {t.full_parameters(), r};
  });
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(out[0].params.size(), out[r].params.size());
    for (size_t i = 0; i < std::min(out[0].params.size(), out[r].params.size()); ++i) {
      EXPECT_TRUE(torch::equal(out[0].params[i].second, out[r].params[i].second))
          << "rank " << r << ": " << out[0].params[i].first;
    }
  }
  return out[0];
}

// Per tensor max|a - b| / max|b| (as `paratrain checkpoint compare`), the
// worst over tensors; names and shapes must match in order.
inline double max_rel_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.sizes(), b[i].second.sizes()) << a[i].first;
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    m = std::max(m, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return m;
}

}  // namespace paratrain::testing
