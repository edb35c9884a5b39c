// Shared by the sharded-checkpoint tests (sharded_checkpoint_test.cpp,
// sharded_layouts_test.cpp): a small net, its one-process reference trained
// for 3 steps, ZeRO-like layouts over 2, 3 and 4 ranks, and what one rank
// holds of it.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint.h"
#include "paratrain/checkpoint/optimizer_state.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/sharded.h"
#include "tests/support/multi_rank.h"

namespace ck = paratrain::checkpoint;
namespace fs = std::filesystem;
using paratrain::CheckpointError;
using paratrain::TensorSlot;

namespace paratrain::testing::sharded {


struct Net : torch::nn::Module {
  torch::nn::Linear fc0{nullptr}, fc1{nullptr};
  at::Tensor scale;  // a buffer: replicated in every layout, rank 0 writes it
  Net() {
    fc0 = register_module("fc0", torch::nn::Linear(7, 5));  // weight: 35 elements, not divisible by 4
    fc1 = register_module("fc1", torch::nn::Linear(5, 3));
    scale = register_buffer("scale", torch::tensor({1.5f, -2.0f}));
  }
  at::Tensor forward(const at::Tensor& x) { return fc1(torch::tanh(fc0(x))) * scale[0]; }
};

enum class Kind { kSgd, kAdam };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind, std::vector<at::Tensor> params) {
  if (kind == Kind::kSgd)
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// One process trained for 3 steps: the oracle every layout must reproduce.
struct Reference {
  std::shared_ptr<Net> net = std::make_shared<Net>();
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::map<std::string, at::Tensor> params;                               // name -> tensor
  std::map<std::string, std::map<std::string, at::Tensor>> state;         // name -> field -> tensor

  explicit Reference(Kind kind) {
    opt = make_optimizer(kind, net->parameters());
    for (int i = 0; i < 3; ++i) {
      auto gen = at::detail::createCPUGenerator(100 + i);
      auto x = at::randn({6, 7}, gen);
      opt->zero_grad();
      net->forward(x).pow(2).mean().backward();
      opt->step();
    }
    const auto& io = ck::optimizer_state_io(*opt, "reference");
    for (const auto& item : net->named_parameters()) {
      params[item.key()] = item.value().detach();
      for (auto& [field, t] : io.save(*opt->state().at(ck::optimizer_state_key(item.value()))))
        state[item.key()][field] = t.clone();
    }
  }
};

// name -> this rank's [offset, offset + numel), or none.
using Layout = std::function<std::optional<std::pair<int64_t, int64_t>>(const std::string& name, int64_t numel, int rank)>;

// ZeRO-like over 4 ranks: uneven contiguous pieces (10/40/20/30 %), and fc1.bias
// wholly on rank 2.
inline std::optional<std::pair<int64_t, int64_t>> zero4(const std::string& name, int64_t numel, int rank) {
  if (name == "fc1.bias") return rank == 2 ? std::optional(std::pair<int64_t, int64_t>{0, numel}) : std::nullopt;
  const double cuts[] = {0.0, 0.1, 0.5, 0.7, 1.0};
  const int64_t lo = static_cast<int64_t>(numel * cuts[rank]), hi = rank == 3 ? numel : static_cast<int64_t>(numel * cuts[rank + 1]);
  return std::pair<int64_t, int64_t>{lo, hi - lo};
}
// Two ranks cut at 70 %: boundaries that match none of zero4's.
inline std::optional<std::pair<int64_t, int64_t>> zero2(const std::string&, int64_t numel, int rank) {
  const int64_t cut = numel * 7 / 10;
  return rank == 0 ? std::pair<int64_t, int64_t>{0, cut} : std::pair<int64_t, int64_t>{cut, numel - cut};
}
// Three ranks, as even as possible.
inline std::optional<std::pair<int64_t, int64_t>> zero3(const std::string&, int64_t numel, int rank) {
  const int64_t lo = numel * rank / 3, hi = numel * (rank + 1) / 3;
  return std::pair<int64_t, int64_t>{lo, hi - lo};
}

// What one rank of a ZeRO-style strategy holds: flat pieces of parameters
// (its own leaf tensors) and an optimizer over them. `from` fills them with
// the reference's pieces (a rank about to save); without it they are zeros
// with no optimizer state (a rank about to load), so equality after loading
// can only come from the checkpoint.
struct Rank {
  std::vector<at::Tensor> pieces;
  std::unique_ptr<torch::optim::Optimizer> opt;
  ck::CheckpointContents contents;
};

inline Rank make_rank(Kind kind, const Reference& ref, const Layout& layout, int rank, bool from_reference,
               bool replicated = false) {
  Rank r;
  std::vector<TensorSlot> slots;
  for (const auto& [name, p] : ref.params) {
    auto range = layout(name, p.numel(), rank);
    if (!range) continue;
    at::Tensor piece = from_reference ? p.reshape(-1).narrow(0, range->first, range->second).clone()
                                      : at::zeros({range->second});
    r.pieces.push_back(piece);
    slots.push_back({name, p.sizes().vec(), range->first, piece, !replicated || rank == 0});
  }
  r.opt = make_optimizer(kind, r.pieces);
  for (size_t i = 0; i < slots.size(); ++i) {
    r.contents.model.push_back(slots[i]);
    r.contents.optimizer_slots.push_back({r.pieces[i], slots[i]});
    if (!from_reference) continue;
    const auto& fields = ref.state.at(slots[i].name);
    auto cut = [&](const char* f) { return fields.at(f).reshape(-1).narrow(0, slots[i].flat_offset, r.pieces[i].numel()).clone(); };
    const auto key = ck::optimizer_state_key(r.pieces[i]);
    if (kind == Kind::kSgd) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(cut("momentum_buffer"));
      r.opt->state()[key] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(fields.at("step").item<int64_t>());
      s->exp_avg(cut("exp_avg"));
      s->exp_avg_sq(cut("exp_avg_sq"));
      r.opt->state()[key] = std::move(s);
    }
  }
  at::Tensor scale = from_reference ? ref.net->scale.clone() : at::zeros({2});
  r.pieces.push_back(scale);
  r.contents.model.push_back({"scale", {2}, 0, scale, rank == 0});
  r.contents.optimizer = r.opt.get();
  r.contents.state.step = 3;
  r.contents.state.epoch = 1;
  r.contents.state.extra["layout"] = "zero";
  return r;
}

// Every element of every slot and of its optimizer state equals the
// reference's; returns how many elements were compared.
inline int64_t expect_matches_reference(Kind kind, const Reference& ref, const Rank& r) {
  int64_t compared = 0;
  const auto& io = ck::optimizer_state_io(*r.opt, "loaded");
  for (const auto& os : r.contents.optimizer_slots) {
    const auto& s = os.slot;
    EXPECT_TRUE(torch::equal(s.local.reshape(-1), ref.params.at(s.name).reshape(-1).narrow(0, s.flat_offset, s.local.numel())))
        << s.name;
    auto it = r.opt->state().find(ck::optimizer_state_key(os.param));
    if (it == r.opt->state().end()) {
      ADD_FAILURE() << "no optimizer state for " << s.name;
      continue;
    }
    auto fields = io.save(*it->second);
    EXPECT_EQ(fields.size(), kind == Kind::kSgd ? 1u : 3u);
    for (auto& [field, t] : fields) {
      const at::Tensor& want = ref.state.at(s.name).at(field);
      if (field == "step") EXPECT_EQ(t.item<int64_t>(), want.item<int64_t>()) << s.name;
      else EXPECT_TRUE(torch::equal(t.reshape(-1), want.reshape(-1).narrow(0, s.flat_offset, t.numel()))) << s.name << "/" << field;
    }
    compared += s.local.numel();
  }
  EXPECT_TRUE(torch::equal(r.contents.model.back().local, ref.net->scale));
  return compared;
}

inline ck::ShardedSaveOptions scratch() {  // tests need no fsync
  ck::ShardedSaveOptions o;
  o.sync = false;
  return o;
}

inline fs::path save_at_4(Kind kind, const Reference& ref, const fs::path& dir) {
  paratrain::testing::run_ranks(4, [&](paratrain::comm::ProcessGroup& g) {
    Rank r = make_rank(kind, ref, zero4, g.rank(), true);
    ck::save_sharded_checkpoint(dir, g, r.contents, scratch());
  });
  return dir;
}

inline void expect_error(const std::function<void()>& fn, std::vector<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a CheckpointError containing " << needles.front();
  } catch (const CheckpointError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

inline nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); }
inline void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(1); }


}  // namespace paratrain::testing::sharded
