// Background checkpoints (train.async_checkpoint): the saver writes what the
// tensors held when save() returned, not what training made of them while it
// wrote; a failed background write is reported on every rank at the next
// wait, without an index; and the Trainer's async checkpoints are the
// synchronous ones, tensor for tensor. Ranks are threads over Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <string_view>

#include <fmt/format.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/async_saver.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace pt = paratrain::train;
namespace fs = std::filesystem;
using paratrain::CheckpointError;
using paratrain::TensorSlot;

namespace {

// Rank r holds elements [4r, 4r + 4) of a 1-D tensor "w" of 4 * size elements.
paratrain::checkpoint::CheckpointContents shard_of(const at::Tensor& local, int rank, int size) {
  paratrain::checkpoint::CheckpointContents c;
  c.model.push_back(TensorSlot{.name = "w", .global_shape = {4 * size}, .flat_offset = 4 * rank, .local = local});
  c.save_rng = false;
  return c;
}

at::Tensor consolidated(const fs::path& dir, const std::string& name) {
  const fs::path file = dir.parent_path() / (dir.filename().string() + ".safetensors");
  paratrain::checkpoint::consolidate_checkpoint(dir, file);
  return paratrain::checkpoint::read_safetensors(file).tensors.at(name);
}

// The writer thread is held at the rank file's header until the test has
// changed the tensor: the write of the data comes after the change.
struct HeldWriter {
  std::promise<void> changed;
  std::shared_future<void> go = changed.get_future().share();
  paratrain::checkpoint::ShardedSaveOptions options() {
    paratrain::checkpoint::ShardedSaveOptions o;
    o.sync = false;
    o.after_write = [go = go](std::string_view what) {
      if (what == "header") go.wait();
    };
    return o;
  }
};

TEST(AsyncCheckpoint, WritesTheStateOfTheMomentOfSave) {
  const fs::path dir = fs::path(paratrain::testing::temp_dir("async-ckpt")) / "step_1";
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    at::Tensor w = torch::arange(4, torch::kFloat) + 4 * g.rank();
    paratrain::checkpoint::AsyncCheckpointSaver saver(g);
    HeldWriter held;
    saver.save(dir, shard_of(w, g.rank(), 2), held.options());
    w.add_(100);  // the next optimizer step
    held.changed.set_value();
    EXPECT_EQ(saver.wait(), dir);
    EXPECT_FALSE(saver.busy());
  });
  EXPECT_TRUE(torch::equal(consolidated(dir, "model/w"), torch::arange(8, torch::kFloat)));
}

// The control: the same held write of views (what the saver would do without
// its copy) sees the change, so the test above can tell the two apart.
TEST(AsyncCheckpoint, ControlWritingViewsSeesTheLaterChange) {
  const fs::path dir = fs::path(paratrain::testing::temp_dir("async-ckpt-views")) / "step_1";
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    at::Tensor w = torch::arange(4, torch::kFloat) + 4 * g.rank();
    HeldWriter held;
    paratrain::checkpoint::ShardedSaveOptions options = held.options();
    options.sync = false;
    auto shard = paratrain::checkpoint::prepare_sharded_checkpoint(dir, shard_of(w, g.rank(), 2), g.rank(), /*copy=*/false);
    auto writer = std::async(std::launch::async, [&] { paratrain::checkpoint::write_prepared_checkpoint(dir, g, *shard, options); });
    w.add_(100);
    held.changed.set_value();
    // The data checksum was taken before the change: the file may not even
    // verify. Either way it does not hold the state of the moment of save.
    try {
      writer.get();
    } catch (const CheckpointError&) {
    }
  });
  bool old_values = false;
  try {
    old_values = torch::equal(consolidated(dir, "model/w"), torch::arange(8, torch::kFloat));
  } catch (const CheckpointError&) {
  }
  EXPECT_FALSE(old_values);
}

TEST(AsyncCheckpoint, AFailedBackgroundWriteFailsTheNextWaitOnEveryRankWithoutAnIndex) {
  const fs::path run = paratrain::testing::temp_dir("async-ckpt-fail");
  const fs::path dir = paratrain::checkpoint::checkpoint_dir(run, 3);
  std::atomic<int> errors{0};
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    at::Tensor w = torch::ones({4});
    paratrain::checkpoint::AsyncCheckpointSaver saver(g);
    paratrain::checkpoint::ShardedSaveOptions options;
    options.sync = false;
    if (g.rank() == 1) options.after_write = [](std::string_view what) {
      if (what != "header") throw std::runtime_error("disk full (simulated)");
    };
    saver.save(dir, shard_of(w, g.rank(), 2), options);
    try {
      saver.wait();
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1: disk full (simulated)"), std::string::npos) << e.what();
      ++errors;
    }
    // The saver is usable again: the next save goes through.
    paratrain::checkpoint::ShardedSaveOptions unsynced;
    unsynced.sync = false;
    saver.save(paratrain::checkpoint::checkpoint_dir(run, 4), shard_of(w, g.rank(), 2), unsynced);
    EXPECT_EQ(saver.wait(), paratrain::checkpoint::checkpoint_dir(run, 4));
  });
  EXPECT_EQ(errors.load(), 2);
  EXPECT_FALSE(fs::exists(dir / "index.json"));
  const auto listed = paratrain::checkpoint::list_checkpoints(run);
  ASSERT_EQ(listed.size(), 1u);  // a checkpoint without its index is never listed
  EXPECT_EQ(listed[0].step, 4);
}

// The Trainer with train.async_checkpoint writes, at every step it saves,
// the checkpoint a synchronous save writes (ZeRO-1 on 2 ranks: sharded
// optimizer state; AdamW: moments and step), and trains the same model.
TEST(AsyncCheckpoint, TrainerCheckpointsEqualTheSynchronousOnes) {
  const std::string out = paratrain::testing::temp_dir("async-ckpt-trainer");
  auto config = [&](bool async) {
    auto c = paratrain::testing::mlp_oracle_config(out, async ? "async" : "sync", 1);
    c.train.checkpoint_every_steps = 5;
    c.train.async_checkpoint = async;
    return c;
  };
  paratrain::testing::Params sync_params, async_params;
  fs::path sync_dir, async_dir;
  for (bool async : {false, true}) {
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
      pt::Trainer t(config(async), g);
      const pt::TrainResult result = t.fit();
      auto params = t.full_parameters();
      if (g.rank() == 0) {
        (async ? async_params : sync_params) = params;
        (async ? async_dir : sync_dir) = result.run_dir;
        EXPECT_EQ(result.last_checkpoint, paratrain::checkpoint::checkpoint_dir(result.run_dir, 20));
      }
    });
  }
  EXPECT_EQ(paratrain::testing::relative_diff(async_params, sync_params), 0.0);
  for (int64_t step : {5, 10, 15, 20}) {
    SCOPED_TRACE(step);
    const fs::path a = paratrain::checkpoint::checkpoint_dir(async_dir, step), s = paratrain::checkpoint::checkpoint_dir(sync_dir, step);
    ASSERT_TRUE(fs::exists(a / "index.json"));
    paratrain::checkpoint::consolidate_checkpoint(a, async_dir / fmt::format("c{}.safetensors", step));
    paratrain::checkpoint::consolidate_checkpoint(s, sync_dir / fmt::format("c{}.safetensors", step));
    const auto at = paratrain::checkpoint::read_safetensors(async_dir / fmt::format("c{}.safetensors", step)).tensors;
    const auto st = paratrain::checkpoint::read_safetensors(sync_dir / fmt::format("c{}.safetensors", step)).tensors;
    ASSERT_EQ(at.size(), st.size());
    for (const auto& [name, tensor] : st) {
      ASSERT_TRUE(at.count(name)) << name;
      EXPECT_TRUE(torch::equal(at.at(name), tensor)) << name;
    }
  }
}

}  // namespace
