// Sharded checkpoints: saved by 4 ranks (threads over Gloo) in a ZeRO-like
// layout, loaded at 2 ranks with another cut and at 1 process whole, each
// element of the model and of the optimizer state (SGD momentum, Adam moments
// and step) equal to the one-process reference; consolidation to the
// single-file format; every kind of damage an error naming the file or
// tensor; run-folder helpers on step directories.
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

namespace pt = paratrain::train;
namespace fs = std::filesystem;
using paratrain::CheckpointError;
using paratrain::TensorSlot;

namespace {

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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind, std::vector<at::Tensor> params) {
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
    const auto& io = pt::optimizer_state_io(*opt, "reference");
    for (const auto& item : net->named_parameters()) {
      params[item.key()] = item.value().detach();
      for (auto& [field, t] : io.save(*opt->state().at(pt::optimizer_state_key(item.value()))))
        state[item.key()][field] = t.clone();
    }
  }
};

// name -> this rank's [offset, offset + numel), or none.
using Layout = std::function<std::optional<std::pair<int64_t, int64_t>>(const std::string& name, int64_t numel, int rank)>;

// ZeRO-like over 4 ranks: uneven contiguous pieces (10/40/20/30 %), and fc1.bias
// wholly on rank 2.
std::optional<std::pair<int64_t, int64_t>> zero4(const std::string& name, int64_t numel, int rank) {
  if (name == "fc1.bias") return rank == 2 ? std::optional(std::pair<int64_t, int64_t>{0, numel}) : std::nullopt;
  const double cuts[] = {0.0, 0.1, 0.5, 0.7, 1.0};
  const int64_t lo = static_cast<int64_t>(numel * cuts[rank]), hi = rank == 3 ? numel : static_cast<int64_t>(numel * cuts[rank + 1]);
  return std::pair<int64_t, int64_t>{lo, hi - lo};
}
// Two ranks cut at 70 %: boundaries that match none of zero4's.
std::optional<std::pair<int64_t, int64_t>> zero2(const std::string&, int64_t numel, int rank) {
  const int64_t cut = numel * 7 / 10;
  return rank == 0 ? std::pair<int64_t, int64_t>{0, cut} : std::pair<int64_t, int64_t>{cut, numel - cut};
}
// Three ranks, as even as possible.
std::optional<std::pair<int64_t, int64_t>> zero3(const std::string&, int64_t numel, int rank) {
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
  pt::CheckpointContents contents;
};

Rank make_rank(Kind kind, const Reference& ref, const Layout& layout, int rank, bool from_reference,
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
    const auto key = pt::optimizer_state_key(r.pieces[i]);
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
int64_t expect_matches_reference(Kind kind, const Reference& ref, const Rank& r) {
  int64_t compared = 0;
  const auto& io = pt::optimizer_state_io(*r.opt, "loaded");
  for (const auto& os : r.contents.optimizer_slots) {
    const auto& s = os.slot;
    EXPECT_TRUE(torch::equal(s.local.reshape(-1), ref.params.at(s.name).reshape(-1).narrow(0, s.flat_offset, s.local.numel())))
        << s.name;
    auto it = r.opt->state().find(pt::optimizer_state_key(os.param));
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

pt::ShardedSaveOptions scratch() {  // tests need no fsync
  pt::ShardedSaveOptions o;
  o.sync = false;
  return o;
}

fs::path save_at_4(Kind kind, const Reference& ref, const fs::path& dir) {
  paratrain::testing::run_ranks(4, [&](paratrain::comm::ProcessGroup& g) {
    Rank r = make_rank(kind, ref, zero4, g.rank(), true);
    pt::save_sharded_checkpoint(dir, g, r.contents, scratch());
  });
  return dir;
}

void expect_error(const std::function<void()>& fn, std::vector<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a CheckpointError containing " << needles.front();
  } catch (const CheckpointError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); }
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(1); }

}  // namespace

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
      const auto state = pt::load_sharded_checkpoint(dir, r.contents);
      EXPECT_EQ(state.step, 3);
      EXPECT_EQ(state.extra.at("layout"), "zero");
      compared += expect_matches_reference(kind, ref, r);
    }
    EXPECT_EQ(compared, 35 + 5 + 15 + 3);

    // 1 process: a whole model and its optimizer, as DDP or a single run holds them.
    torch::manual_seed(77);
    Net net;
    auto opt = make_optimizer(kind, net.parameters());
    pt::CheckpointContents whole;
    whole.optimizer = opt.get();
    for (const auto& item : net.named_parameters()) {
      TensorSlot s{item.key(), item.value().sizes().vec(), 0, item.value(), true};
      whole.model.push_back(s);
      whole.optimizer_slots.push_back({item.value(), s});
    }
    whole.model.push_back({"scale", {2}, 0, net.scale, true});
    pt::load_sharded_checkpoint(dir, whole);
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
    pt::CheckpointContents c;
    c.optimizer = &opt;
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto& fields = ref.state.at(slots[i].name);
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(fields.at("step").item<int64_t>());
      st->exp_avg(cut_like(fields.at("exp_avg"), slots[i]));
      st->exp_avg_sq(cut_like(fields.at("exp_avg_sq"), slots[i]));
      opt.state()[pt::optimizer_state_key(locals[i])] = std::move(st);
      c.model.push_back(slots[i]);
      c.optimizer_slots.push_back({locals[i], slots[i]});
    }
    c.state.step = 3;
    pt::save_sharded_checkpoint(dir, g, c, scratch());
  });
  // fc0.weight is 5 x 7: 5 rows x 2 ranks = 10 runs.
  EXPECT_EQ(read_json(dir / "index.json")["tensors"]["model/fc0.weight"]["chunks"].size(), 10u);

  // As one process: every parameter and Adam field whole and exact.
  torch::manual_seed(78);
  Net net;
  torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(0.01));
  pt::CheckpointContents whole;
  whole.optimizer = &opt;
  for (const auto& item : net.named_parameters()) {
    TensorSlot s{item.key(), item.value().sizes().vec(), 0, item.value(), true};
    whole.model.push_back(s);
    whole.optimizer_slots.push_back({item.value(), s});
  }
  pt::load_sharded_checkpoint(dir, whole);
  const auto& io = pt::optimizer_state_io(opt, "loaded");
  for (const auto& item : net.named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), ref.params.at(item.key()))) << item.key();
    for (auto& [field, t] : io.save(*opt.state().at(pt::optimizer_state_key(item.value())))) {
      EXPECT_TRUE(torch::equal(t, ref.state.at(item.key()).at(field))) << item.key() << "/" << field;
    }
  }

  // Back into the same shards, from zeros.
  for (int rank = 0; rank < 2; ++rank) {
    pt::CheckpointContents c;
    std::vector<ColumnShard> shards;
    for (const auto& [name, p] : ref.params) shards.push_back(column_shard(name, p, rank, false));
    for (auto& sh : shards) c.model.push_back(sh.slot);
    pt::load_sharded_checkpoint(dir, c);
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
    pt::save_sharded_checkpoint(dir, g, r.contents, scratch());
  });
  // Only rank 0 wrote: rank 1's file has no tensors.
  EXPECT_TRUE(pt::read_safetensors(dir / "rank_1.safetensors").tensors.empty());
  int64_t compared = 0;
  for (int rank = 0; rank < 3; ++rank) {
    Rank r = make_rank(Kind::kAdam, ref, zero3, rank, false);
    pt::load_sharded_checkpoint(dir, r.contents);
    compared += expect_matches_reference(Kind::kAdam, ref, r);
  }
  EXPECT_EQ(compared, 58);
}

TEST(ShardedCheckpoint, ConsolidatedFileIsTheSingleFileFormat) {
  torch::manual_seed(3);
  Reference ref(Kind::kAdam);
  const fs::path tmp = paratrain::testing::temp_dir("consolidate");
  const auto dir = save_at_4(Kind::kAdam, ref, tmp / "step_00000003");
  pt::consolidate_checkpoint(dir, tmp / "one.safetensors");

  // Same names, shapes, dtypes and values as save_checkpoint writes.
  pt::TrainingState state;
  state.step = 3;
  state.epoch = 1;
  state.extra["layout"] = "zero";
  pt::save_checkpoint(tmp / "direct.safetensors", *ref.net, *ref.opt, state, {.save_rng = false});
  const auto direct = pt::read_safetensors(tmp / "direct.safetensors");
  auto consolidated = pt::read_safetensors(tmp / "one.safetensors");
  consolidated.tensors.erase("rng/cpu");
  ASSERT_EQ(consolidated.tensors.size(), direct.tensors.size());
  for (const auto& [name, t] : direct.tensors) {
    ASSERT_TRUE(consolidated.tensors.count(name)) << name;
    EXPECT_EQ(consolidated.tensors.at(name).sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(consolidated.tensors.at(name), t)) << name;
  }
  for (const char* key : {"format", "step", "epoch", "optimizer", "optimizer_options", "extra.layout"})
    EXPECT_EQ(consolidated.metadata.at(key), direct.metadata.at(key)) << key;

  // And load_checkpoint takes it: model and optimizer state of the reference.
  torch::manual_seed(55);
  Net net;
  auto opt = make_optimizer(Kind::kAdam, net.parameters());
  EXPECT_EQ(pt::load_checkpoint(tmp / "one.safetensors", net, *opt).step, 3);
  EXPECT_TRUE(torch::equal(net.fc0->weight, ref.net->fc0->weight));
  EXPECT_TRUE(torch::equal(net.scale, ref.net->scale));
  const auto& s = static_cast<torch::optim::AdamParamState&>(*opt->state().at(pt::optimizer_state_key(net.fc0->weight)));
  EXPECT_EQ(s.step(), 3);
  EXPECT_TRUE(torch::equal(s.exp_avg_sq(), ref.state.at("fc0.weight").at("exp_avg_sq")));

  // A single file (consolidated, or today's save_checkpoint) loads into a
  // sharded layout too: it reads as a one-rank checkpoint of whole tensors.
  for (const char* file : {"one.safetensors", "direct.safetensors"}) {
    Rank r = make_rank(Kind::kAdam, ref, zero2, 1, false);
    EXPECT_EQ(pt::load_sharded_checkpoint(tmp / file, r.contents).step, 3) << file;
    EXPECT_GT(expect_matches_reference(Kind::kAdam, ref, r), 0) << file;
  }
  EXPECT_NE(pt::describe_checkpoint(tmp / "one.safetensors").find("single file"), std::string::npos);
}

TEST(ShardedCheckpoint, DamageIsAnErrorNamingTheFileOrTensor) {
  torch::manual_seed(4);
  Reference ref(Kind::kSgd);
  const fs::path tmp = paratrain::testing::temp_dir("damage");
  const auto good = save_at_4(Kind::kSgd, ref, tmp / "good");
  int n = 0;
  auto damaged = [&](const std::function<void(const fs::path&)>& damage) {
    const fs::path copy = tmp / fmt::format("copy{}", n++);
    fs::copy(good, copy, fs::copy_options::recursive);
    damage(copy);
    return copy;
  };
  auto load_whole = [&](const fs::path& dir) {
    Rank r = make_rank(Kind::kSgd, ref, zero2, 0, false);
    pt::load_sharded_checkpoint(dir, r.contents);
  };
  // Control: the undamaged copy loads.
  EXPECT_NO_THROW(load_whole(damaged([](const fs::path&) {})));

  auto missing = damaged([](const fs::path& d) { fs::remove(d / "rank_1.safetensors"); });
  expect_error([&] { load_whole(missing); }, {"rank_1.safetensors", "missing"});

  auto truncated = damaged([](const fs::path& d) {
    fs::resize_file(d / "rank_0.safetensors", fs::file_size(d / "rank_0.safetensors") - 10);
  });
  expect_error([&] { load_whole(truncated); }, {"rank_0.safetensors", "truncated"});

  auto flipped = damaged([](const fs::path& d) {
    std::fstream f(d / "rank_1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(c ^ 0x10));
  });
  expect_error([&] { load_whole(flipped); }, {"rank_1.safetensors", "checksum"});

  auto absent = damaged([](const fs::path& d) {
    auto j = read_json(d / "index.json");
    for (auto& f : j["files"])
      if (f["file"] == "rank_3.safetensors") f["file"] = "rank_9.safetensors";
    for (auto& [name, t] : j["tensors"].items())
      for (auto& c : t["chunks"])
        if (c["file"] == "rank_3.safetensors") c["file"] = "rank_9.safetensors";
    write_json(d / "index.json", j);
  });
  expect_error([&] { load_whole(absent); }, {"rank_9.safetensors"});

  auto gap = damaged([](const fs::path& d) {
    auto j = read_json(d / "index.json");
    j["tensors"]["model/fc0.weight"]["chunks"].erase(1);
    write_json(d / "index.json", j);
  });
  expect_error([&] { load_whole(gap); }, {"index.json", "model/fc0.weight", "gap"});

  auto wrong_key = damaged([](const fs::path& d) {
    auto j = read_json(d / "index.json");
    j["tensors"]["model/fc0.bias"]["chunks"][0]["key"] = "model/fc0.bias@999";
    write_json(d / "index.json", j);
  });
  expect_error([&] { load_whole(wrong_key); }, {"model/fc0.bias@999", "do not match"});

  // A model the checkpoint was not saved from.
  Rank other = make_rank(Kind::kSgd, ref, zero2, 0, false);
  other.contents.model[0].global_shape = {5, 8};
  expect_error([&] { pt::load_sharded_checkpoint(good, other.contents); }, {"model/fc0.bias", "[5, 8]"});
}

TEST(ShardedCheckpoint, ACrashBeforeTheIndexLeavesNoCheckpoint) {
  torch::manual_seed(5);
  Reference ref(Kind::kSgd);
  const fs::path run = paratrain::testing::temp_dir("crash");
  save_at_4(Kind::kSgd, ref, pt::checkpoint_dir(run, 3));
  // Rank 2 "crashes" while writing its shard of step 6: every rank gets the
  // error (none hangs), and no index is written.
  std::atomic<int> errors{0};
  paratrain::testing::run_ranks(4, [&](paratrain::comm::ProcessGroup& g) {
    Rank r = make_rank(Kind::kSgd, ref, zero4, g.rank(), true);
    pt::ShardedSaveOptions options = scratch();
    if (g.rank() == 2) options.after_write = [](std::string_view what) {
      if (what != "header") throw std::runtime_error("simulated crash");
    };
    try {
      pt::save_sharded_checkpoint(pt::checkpoint_dir(run, 6), g, r.contents, options);
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2: simulated crash"), std::string::npos) << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 4);
  EXPECT_TRUE(fs::exists(pt::checkpoint_dir(run, 6) / "rank_0.safetensors"));
  EXPECT_FALSE(fs::exists(pt::checkpoint_dir(run, 6) / "index.json"));
  // Leftovers of a killed process: a temporary file the writer never removed.
  std::ofstream(pt::checkpoint_dir(run, 3) / "rank_0.safetensors.tmp.4242") << "partial";
  std::ofstream(run / "checkpoints" / "step_00000002.safetensors.tmp.17") << "partial";

  EXPECT_EQ(pt::find_latest_checkpoint(run), pt::checkpoint_dir(run, 3));
  EXPECT_EQ(pt::list_checkpoints(run).size(), 1u);
  EXPECT_EQ(pt::clean_interrupted_checkpoints(run), 3);
  EXPECT_FALSE(fs::exists(pt::checkpoint_dir(run, 6)));
  EXPECT_FALSE(fs::exists(pt::checkpoint_dir(run, 3) / "rank_0.safetensors.tmp.4242"));
  EXPECT_TRUE(fs::exists(pt::checkpoint_dir(run, 3) / "index.json"));
  EXPECT_EQ(pt::clean_interrupted_checkpoints(run), 0);
}

TEST(ShardedCheckpoint, ResumeCandidatesSkipDamagedOnesAndPruneKeepsTheNewest) {
  torch::manual_seed(6);
  Reference ref(Kind::kSgd);
  const fs::path run = paratrain::testing::temp_dir("prune");
  EXPECT_FALSE(pt::find_latest_checkpoint(run).has_value());
  for (int64_t step : {10, 20, 30, 40}) {
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
      Rank r = make_rank(Kind::kSgd, ref, zero2, g.rank(), true);
      r.contents.state.step = step;
      pt::save_sharded_checkpoint(pt::checkpoint_dir(run, step), g, r.contents, scratch());
    });
  }
  // Newest: a corrupt metadata value; next: a shard cut short. Both skipped.
  auto j = read_json(pt::checkpoint_dir(run, 40) / "index.json");
  j["metadata"]["step"] = "forty";
  write_json(pt::checkpoint_dir(run, 40) / "index.json", j);
  fs::resize_file(pt::checkpoint_dir(run, 30) / "rank_1.safetensors", 100);
  const auto loadable = pt::find_loadable_checkpoints(run);
  ASSERT_EQ(loadable.size(), 2u);
  EXPECT_EQ(loadable[0], pt::checkpoint_dir(run, 20));
  EXPECT_EQ(loadable[1], pt::checkpoint_dir(run, 10));
  EXPECT_EQ(pt::find_latest_checkpoint(run), pt::checkpoint_dir(run, 20));

  EXPECT_EQ(pt::prune_checkpoints(run, 0), 0);  // train.keep_checkpoints = 0 keeps all
  EXPECT_EQ(pt::prune_checkpoints(run, 3), 1);
  EXPECT_FALSE(fs::exists(pt::checkpoint_dir(run, 10)));
  EXPECT_TRUE(fs::exists(pt::checkpoint_dir(run, 20)));
  EXPECT_TRUE(fs::exists(pt::checkpoint_dir(run, 40)));
}

TEST(ShardedCheckpoint, SingleFileChecksumCatchesABitFlip) {
  torch::manual_seed(7);
  Reference ref(Kind::kSgd);
  const fs::path file = fs::path(paratrain::testing::temp_dir("flip")) / "c.safetensors";
  pt::save_checkpoint(file, *ref.net, *ref.opt, {});
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-40, std::ios::end);  // inside tensor data
    const char c = static_cast<char>(f.get());
    f.seekp(-40, std::ios::end);
    f.put(static_cast<char>(c ^ 0x01));
  }
  Net net;
  auto opt = make_optimizer(Kind::kSgd, net.parameters());
  expect_error([&] { pt::load_checkpoint(file, net, *opt); }, {file.string(), "checksum"});
  expect_error([&] { pt::load_model_weights(file, net); }, {file.string(), "checksum"});
}

TEST(ShardedCheckpoint, CliInspectsAndConsolidates) {
  torch::manual_seed(8);
  Reference ref(Kind::kAdam);
  const fs::path tmp = paratrain::testing::temp_dir("cli-ckpt");
  const auto dir = save_at_4(Kind::kAdam, ref, tmp / "step_00000003");
  auto inspect = paratrain::testing::run_cli({"checkpoint", "inspect", dir.string()});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* needle : {"world size: 4", "step: 3", "rank_3.safetensors", "crc32",
                             "model/fc0.weight  F32 [5, 7]  4 chunk(s)", "optimizer/fc1.bias/step  I64 []"})
    EXPECT_NE(inspect.output.find(needle), std::string::npos) << needle << "\n" << inspect.output;

  const auto out = tmp / "whole.safetensors";
  auto consolidate = paratrain::testing::run_cli({"checkpoint", "consolidate", dir.string(), "-o", out.string()});
  ASSERT_EQ(consolidate.exit_code, 0) << consolidate.output;
  EXPECT_TRUE(torch::equal(pt::read_safetensors(out).tensors.at("model/fc0.weight"), ref.params.at("fc0.weight")));

  fs::remove(dir / "rank_2.safetensors");
  auto broken = paratrain::testing::run_cli({"checkpoint", "consolidate", dir.string(), "-o", (tmp / "x").string()});
  EXPECT_EQ(broken.exit_code, 1) << broken.output;
  EXPECT_NE(broken.output.find("rank_2.safetensors"), std::string::npos) << broken.output;
  EXPECT_FALSE(fs::exists(tmp / "x"));
}
