// Sharded checkpoints across layouts: saved by 4 ranks (threads over Gloo)
// in a ZeRO-like layout, loaded at 2 ranks with another cut and at 1 process
// whole, each element of the model and of the optimizer state (SGD momentum,
// Adam moments and step) equal to the one-process reference; non-contiguous
// tensor-parallel shards; a replicated layout written by rank 0.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/checkpoint/sharded_fixture.h"

using namespace paratrain::testing::sharded;  // NOLINT: the fixture's helpers

TEST(ShardedCheckpoint, SavedAt4RanksLoadsAt2RanksAnd1ProcessExactly) {
  for (Kind kind : {Kind::kSgd, Kind::kAdam}) {
    SCOPED_TRACE(kind == Kind::kSgd ? "sgd" : "adam");
    torch::manual_seed(1);
    Reference ref(kind);
    const auto dir = save_at_4(kind, ref, fs::path(paratrain::testing::temp_dir("sharded")) / "step_00000003");
    ASSERT_TRUE(fs::exists(dir / "index.json"));
    const auto index = read_json(dir / "index.json");
    EXPECT_EQ(index["world_size"], 4);
    EXPECT_EQ(index["tensors"]["model/fc1.bias"]["chunks"].size(), 1u);  // wholly on rank 2
    EXPECT_EQ(index["tensors"]["model/fc0.weight"]["chunks"].size(), 4u);

    // 2 ranks, other cut: every element read across chunk boundaries.
    int64_t compared = 0;
    for (int rank = 0; rank < 2; ++rank) {
      Rank r = make_rank(kind, ref, zero2, rank, false);
      const auto state = ck::load_sharded_checkpoint(dir, r.contents);
      EXPECT_EQ(state.step, 3);
      EXPECT_EQ(state.extra.at("layout"), "zero");
      compared += expect_matches_reference(kind, ref, r);
    }
    EXPECT_EQ(compared, 35 + 5 + 15 + 3);

    // 1 process: a whole model and its optimizer, as DDP or a single run holds them.
    torch::manual_seed(77);
    Net net;
    auto opt = make_optimizer(kind, net.parameters());
    ck::CheckpointContents whole;
    whole.optimizer = opt.get();
    for (const auto& item : net.named_parameters()) {
      TensorSlot s{item.key(), item.value().sizes().vec(), 0, item.value(), true};
      whole.model.push_back(s);
      whole.optimizer_slots.push_back({item.value(), s});
    }
    whole.model.push_back({"scale", {2}, 0, net.scale, true});
    ck::load_sharded_checkpoint(dir, whole);
    Rank as_rank{{}, std::move(opt), whole};
    EXPECT_EQ(expect_matches_reference(kind, ref, as_rank), 58);
    // One more step from the loaded state equals one more reference step:
    // the whole optimizer state (Adam's step count included) came back.
    auto x = at::randn({6, 7}, at::detail::createCPUGenerator(500));
    for (auto* m : {&net, ref.net.get()}) {
      auto* o = m == &net ? as_rank.opt.get() : ref.opt.get();
      o->zero_grad();
      m->forward(x).pow(2).mean().backward();
      o->step();
    }
    EXPECT_TRUE(torch::equal(net.fc0->weight, ref.net->fc0->weight));
  }
}

// A tensor-parallel layout: each rank holds some columns of every weight (a
// row-parallel linear's shard: one run per row of the global tensor) and half
// of every bias. Saved at 2 ranks with Adam state, it loads as one process
// and back into the same non-contiguous shards, every element exact.
namespace {

struct ColumnShard {
  at::Tensor local;
  TensorSlot slot;
};

// Columns [c0, c1) of a 2-D `full` (rank 0 takes the first ceil(cols/2)), or
// half of a 1-D one; `from` gives the values (zeros: a rank about to load).
ColumnShard column_shard(const std::string& name, const at::Tensor& full, int rank, bool from) {
  ColumnShard out;
  out.slot.name = name;
  out.slot.global_shape = full.sizes().vec();
  if (full.dim() == 2) {
    const int64_t rows = full.size(0), cols = full.size(1), half = (cols + 1) / 2;
    const int64_t c0 = rank == 0 ? 0 : half, width = rank == 0 ? half : cols - half;
    out.local = from ? full.narrow(1, c0, width).contiguous().clone() : at::zeros({rows, width});
    for (int64_t r = 0; r < rows; ++r) out.slot.segments.push_back({r * width, r * cols + c0, width});
  } else {
    const int64_t half = (full.numel() + 1) / 2;
    const int64_t lo = rank == 0 ? 0 : half, n = rank == 0 ? half : full.numel() - half;
    out.local = from ? full.narrow(0, lo, n).clone() : at::zeros({n});
    out.slot.flat_offset = lo;
  }
  out.slot.local = out.local;
  return out;
}

at::Tensor cut_like(const at::Tensor& full, const TensorSlot& slot) {
  at::Tensor flat = full.reshape(-1), out = at::empty({slot.local.numel()});
  for (const auto& run : paratrain::slot_segments(slot)) {
    out.narrow(0, run.local_offset, run.numel).copy_(flat.narrow(0, run.global_offset, run.numel));
  }
  return out.reshape(slot.local.sizes());
}

}  // namespace

TEST(ShardedCheckpoint, NonContiguousTensorParallelShardsRoundTrip) {
  torch::manual_seed(3);
  Reference ref(Kind::kAdam);
  const auto dir = fs::path(paratrain::testing::temp_dir("sharded_tp")) / "step_00000003";
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    std::vector<at::Tensor> locals;
    std::vector<TensorSlot> slots;
    for (const auto& [name, p] : ref.params) {
      auto shard = column_shard(name, p, g.rank(), true);
      locals.push_back(shard.local);
      slots.push_back(shard.slot);
    }
    torch::optim::Adam opt(locals, torch::optim::AdamOptions(0.01));
    ck::CheckpointContents c;
    c.optimizer = &opt;
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto& fields = ref.state.at(slots[i].name);
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(fields.at("step").item<int64_t>());
      st->exp_avg(cut_like(fields.at("exp_avg"), slots[i]));
      st->exp_avg_sq(cut_like(fields.at("exp_avg_sq"), slots[i]));
      opt.state()[ck::optimizer_state_key(locals[i])] = std::move(st);
      c.model.push_back(slots[i]);
      c.optimizer_slots.push_back({locals[i], slots[i]});
    }
    c.state.step = 3;
    ck::save_sharded_checkpoint(dir, g, c, scratch());
  });
  // fc0.weight is 5 x 7: 5 rows x 2 ranks = 10 runs.
  EXPECT_EQ(read_json(dir / "index.json")["tensors"]["model/fc0.weight"]["chunks"].size(), 10u);

  // As one process: every parameter and Adam field whole and exact.
  torch::manual_seed(78);
  Net net;
  torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(0.01));
  ck::CheckpointContents whole;
  whole.optimizer = &opt;
  for (const auto& item : net.named_parameters()) {
    TensorSlot s{item.key(), item.value().sizes().vec(), 0, item.value(), true};
    whole.model.push_back(s);
    whole.optimizer_slots.push_back({item.value(), s});
  }
  ck::load_sharded_checkpoint(dir, whole);
  const auto& io = ck::optimizer_state_io(opt, "loaded");
  for (const auto& item : net.named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), ref.params.at(item.key()))) << item.key();
    for (auto& [field, t] : io.save(*opt.state().at(ck::optimizer_state_key(item.value())))) {
      EXPECT_TRUE(torch::equal(t, ref.state.at(item.key()).at(field))) << item.key() << "/" << field;
    }
  }

  // Back into the same shards, from zeros.
  for (int rank = 0; rank < 2; ++rank) {
    ck::CheckpointContents c;
    std::vector<ColumnShard> shards;
    for (const auto& [name, p] : ref.params) shards.push_back(column_shard(name, p, rank, false));
    for (auto& sh : shards) c.model.push_back(sh.slot);
    ck::load_sharded_checkpoint(dir, c);
    for (const auto& sh : shards) {
      EXPECT_TRUE(torch::equal(sh.local, cut_like(ref.params.at(sh.slot.name), sh.slot))) << sh.slot.name;
    }
  }
}

TEST(ShardedCheckpoint, ReplicatedLayoutWrittenByRank0LoadsAt3Ranks) {
  torch::manual_seed(2);
  Reference ref(Kind::kAdam);
  const fs::path dir = fs::path(paratrain::testing::temp_dir("replicated")) / "step_00000003";
  auto whole = [](const std::string&, int64_t numel, int) { return std::optional(std::pair<int64_t, int64_t>{0, numel}); };
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Rank r = make_rank(Kind::kAdam, ref, whole, g.rank(), true, /*replicated=*/true);
    ck::save_sharded_checkpoint(dir, g, r.contents, scratch());
  });
  // Only rank 0 wrote: rank 1's file has no tensors.
  EXPECT_TRUE(ck::read_safetensors(dir / "rank_1.safetensors").tensors.empty());
  int64_t compared = 0;
  for (int rank = 0; rank < 3; ++rank) {
    Rank r = make_rank(Kind::kAdam, ref, zero3, rank, false);
    ck::load_sharded_checkpoint(dir, r.contents);
    compared += expect_matches_reference(Kind::kAdam, ref, r);
  }
  EXPECT_EQ(compared, 58);
}

