// Sharded checkpoints as files: consolidation to the single-file format;
// every kind of damage an error naming the file or tensor; a crash before the
// index; run-folder helpers on step directories; checksums; the CLI.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/safetensors_file.h"
#include "tests/checkpoint/sharded_fixture.h"

using namespace paratrain::testing::sharded;  // NOLINT: the fixture's helpers

TEST(ShardedCheckpoint, ConsolidatedFileIsTheSingleFileFormat) {
  torch::manual_seed(3);
  Reference ref(Kind::kAdam);
  const fs::path tmp = paratrain::testing::temp_dir("consolidate");
  const auto dir = save_at_4(Kind::kAdam, ref, tmp / "step_00000003");
  ck::consolidate_checkpoint(dir, tmp / "one.safetensors");

  // Same names, shapes, dtypes and values as save_checkpoint writes.
  ck::TrainingState state;
  state.step = 3;
  state.epoch = 1;
  state.extra["layout"] = "zero";
  ck::save_checkpoint(tmp / "direct.safetensors", *ref.net, *ref.opt, state, {.save_rng = false});
  const auto direct = ck::read_safetensors(tmp / "direct.safetensors");
  auto consolidated = ck::read_safetensors(tmp / "one.safetensors");
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
  EXPECT_EQ(ck::load_checkpoint(tmp / "one.safetensors", net, *opt).step, 3);
  EXPECT_TRUE(torch::equal(net.fc0->weight, ref.net->fc0->weight));
  EXPECT_TRUE(torch::equal(net.scale, ref.net->scale));
  const auto& s = static_cast<torch::optim::AdamParamState&>(*opt->state().at(ck::optimizer_state_key(net.fc0->weight)));
  EXPECT_EQ(s.step(), 3);
  EXPECT_TRUE(torch::equal(s.exp_avg_sq(), ref.state.at("fc0.weight").at("exp_avg_sq")));

  // A single file (consolidated, or today's save_checkpoint) loads into a
  // sharded layout too: it reads as a one-rank checkpoint of whole tensors.
  for (const char* file : {"one.safetensors", "direct.safetensors"}) {
    Rank r = make_rank(Kind::kAdam, ref, zero2, 1, false);
    EXPECT_EQ(ck::load_sharded_checkpoint(tmp / file, r.contents).step, 3) << file;
    EXPECT_GT(expect_matches_reference(Kind::kAdam, ref, r), 0) << file;
  }
  EXPECT_NE(ck::describe_checkpoint(tmp / "one.safetensors").find("single file"), std::string::npos);
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
    ck::load_sharded_checkpoint(dir, r.contents);
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
  expect_error([&] { ck::load_sharded_checkpoint(good, other.contents); }, {"model/fc0.bias", "[5, 8]"});
}

TEST(ShardedCheckpoint, ACrashBeforeTheIndexLeavesNoCheckpoint) {
  torch::manual_seed(5);
  Reference ref(Kind::kSgd);
  const fs::path run = paratrain::testing::temp_dir("crash");
  save_at_4(Kind::kSgd, ref, ck::checkpoint_dir(run, 3));
  // Rank 2 "crashes" while writing its shard of step 6: every rank gets the
  // error (none hangs), and no index is written.
  std::atomic<int> errors{0};
  paratrain::testing::run_ranks(4, [&](paratrain::comm::ProcessGroup& g) {
    Rank r = make_rank(Kind::kSgd, ref, zero4, g.rank(), true);
    ck::ShardedSaveOptions options = scratch();
    if (g.rank() == 2) options.after_write = [](std::string_view what) {
      if (what != "header") throw std::runtime_error("simulated crash");
    };
    try {
      ck::save_sharded_checkpoint(ck::checkpoint_dir(run, 6), g, r.contents, options);
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2: simulated crash"), std::string::npos) << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 4);
  EXPECT_TRUE(fs::exists(ck::checkpoint_dir(run, 6) / "rank_0.safetensors"));
  EXPECT_FALSE(fs::exists(ck::checkpoint_dir(run, 6) / "index.json"));
  // Leftovers of a killed process: a temporary file the writer never removed.
  std::ofstream(ck::checkpoint_dir(run, 3) / "rank_0.safetensors.tmp.4242") << "partial";
  std::ofstream(run / "checkpoints" / "step_00000002.safetensors.tmp.17") << "partial";

  EXPECT_EQ(ck::find_latest_checkpoint(run), ck::checkpoint_dir(run, 3));
  EXPECT_EQ(ck::list_checkpoints(run).size(), 1u);
  EXPECT_EQ(ck::clean_interrupted_checkpoints(run), 3);
  EXPECT_FALSE(fs::exists(ck::checkpoint_dir(run, 6)));
  EXPECT_FALSE(fs::exists(ck::checkpoint_dir(run, 3) / "rank_0.safetensors.tmp.4242"));
  EXPECT_TRUE(fs::exists(ck::checkpoint_dir(run, 3) / "index.json"));
  EXPECT_EQ(ck::clean_interrupted_checkpoints(run), 0);
}

// Note [Open shard files] (checkpoint_index.cpp): a reader keeps a bounded
// number of shard files open (32; 3 here, so that few ranks show it). 8
// ranks' files are loaded and consolidated under a descriptor limit 6 above
// what the process holds now, where keeping every file open would need 8.
TEST(ShardedCheckpoint, ManyShardFilesAreReadUnderALowDescriptorLimit) {
  constexpr int kRanks = 8;
  const fs::path run = paratrain::testing::temp_dir("many_shards");
  const fs::path dir = run / "checkpoint";
  const at::Tensor whole = torch::arange(kRanks * 4, torch::kFloat).reshape({kRanks, 4});
  paratrain::testing::run_ranks(kRanks, [&](paratrain::comm::ProcessGroup& g) {
    ck::CheckpointContents contents;
    contents.save_rng = false;
    contents.model.push_back(TensorSlot{"w", {kRanks, 4}, g.rank() * 4, whole[g.rank()].clone(), true});
    ck::save_sharded_checkpoint(dir, g, contents, scratch());
  });
  auto open_descriptors = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_descriptors() + 6);
  ck::set_max_open_shard_files(3);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  at::Tensor loaded = at::zeros({kRanks, 4}), from_file = at::zeros({kRanks, 4});
  std::string error;
  try {
    ck::CheckpointContents contents;
    contents.model.push_back(TensorSlot{"w", {kRanks, 4}, 0, loaded, true});
    ck::load_sharded_checkpoint(dir, contents);
    ck::consolidate_checkpoint(dir, run / "whole.safetensors");
    ck::CheckpointContents file_contents;
    file_contents.model.push_back(TensorSlot{"w", {kRanks, 4}, 0, from_file, true});
    ck::load_sharded_checkpoint(run / "whole.safetensors", file_contents);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ck::set_max_open_shard_files(32);
  EXPECT_EQ(error, "");
  EXPECT_TRUE(torch::equal(loaded, whole));
  EXPECT_TRUE(torch::equal(from_file, whole));
}

// A file closed to bound the open descriptors is reopened only if it is the
// one that was verified: a save over it since (a new inode) is refused.
TEST(ShardedCheckpoint, AClosedShardFileReplacedSinceItWasVerifiedIsRefused) {
  const fs::path dir = paratrain::testing::temp_dir("replaced_shard");
  const fs::path file = dir / "t.safetensors";
  ck::SafetensorsContents first, second;
  first.tensors["w"] = torch::arange(6, torch::kFloat);
  second.tensors["w"] = torch::arange(6, torch::kFloat) * 2;
  ck::write_safetensors(file, first);
  ck::SafetensorsFile verified(file);
  EXPECT_TRUE(torch::equal(verified.read("w", 2, 3), torch::arange(2, 5, torch::kFloat)));
  verified.close();
  EXPECT_TRUE(torch::equal(verified.read("w", 0, 2), torch::arange(2, torch::kFloat)));  // reopened: the same file
  verified.close();
  ck::write_safetensors(file, second);  // a new file renamed over the old one
  try {
    verified.read("w", 0, 2);
    ADD_FAILURE() << "a replaced file was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("replaced since it was verified"), std::string::npos) << e.what();
  }
}

TEST(ShardedCheckpoint, ResumeCandidatesSkipDamagedOnesAndPruneKeepsTheNewest) {
  torch::manual_seed(6);
  Reference ref(Kind::kSgd);
  const fs::path run = paratrain::testing::temp_dir("prune");
  EXPECT_FALSE(ck::find_latest_checkpoint(run).has_value());
  for (int64_t step : {10, 20, 30, 40}) {
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
      Rank r = make_rank(Kind::kSgd, ref, zero2, g.rank(), true);
      r.contents.state.step = step;
      ck::save_sharded_checkpoint(ck::checkpoint_dir(run, step), g, r.contents, scratch());
    });
  }
  // Newest: a corrupt metadata value; next: a shard cut short. Both skipped.
  auto j = read_json(ck::checkpoint_dir(run, 40) / "index.json");
  j["metadata"]["step"] = "forty";
  write_json(ck::checkpoint_dir(run, 40) / "index.json", j);
  fs::resize_file(ck::checkpoint_dir(run, 30) / "rank_1.safetensors", 100);
  const auto loadable = ck::find_loadable_checkpoints(run);
  ASSERT_EQ(loadable.size(), 2u);
  EXPECT_EQ(loadable[0], ck::checkpoint_dir(run, 20));
  EXPECT_EQ(loadable[1], ck::checkpoint_dir(run, 10));
  EXPECT_EQ(ck::find_latest_checkpoint(run), ck::checkpoint_dir(run, 20));

  EXPECT_EQ(ck::prune_checkpoints(run, 0), 0);  // train.keep_checkpoints = 0 keeps all
  EXPECT_EQ(ck::prune_checkpoints(run, 3), 1);
  EXPECT_FALSE(fs::exists(ck::checkpoint_dir(run, 10)));
  EXPECT_TRUE(fs::exists(ck::checkpoint_dir(run, 20)));
  EXPECT_TRUE(fs::exists(ck::checkpoint_dir(run, 40)));
}

TEST(ShardedCheckpoint, SingleFileChecksumCatchesABitFlip) {
  torch::manual_seed(7);
  Reference ref(Kind::kSgd);
  const fs::path file = fs::path(paratrain::testing::temp_dir("flip")) / "c.safetensors";
  ck::save_checkpoint(file, *ref.net, *ref.opt, {});
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-40, std::ios::end);  // inside tensor data
    const char c = static_cast<char>(f.get());
    f.seekp(-40, std::ios::end);
    f.put(static_cast<char>(c ^ 0x01));
  }
  Net net;
  auto opt = make_optimizer(Kind::kSgd, net.parameters());
  expect_error([&] { ck::load_checkpoint(file, net, *opt); }, {file.string(), "checksum"});
  expect_error([&] { ck::load_model_weights(file, net); }, {file.string(), "checksum"});
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
  EXPECT_TRUE(torch::equal(ck::read_safetensors(out).tensors.at("model/fc0.weight"), ref.params.at("fc0.weight")));

  fs::remove(dir / "rank_2.safetensors");
  auto broken = paratrain::testing::run_cli({"checkpoint", "consolidate", dir.string(), "-o", (tmp / "x").string()});
  EXPECT_EQ(broken.exit_code, 1) << broken.output;
  EXPECT_NE(broken.output.find("rank_2.safetensors"), std::string::npos) << broken.output;
  EXPECT_FALSE(fs::exists(tmp / "x"));
}
