// train.activation_checkpointing as a user runs it: `paratrain launch` of
// two real processes training the fortunes GPT with dropout on, each layout
// once keeping every activation and once recomputing every block; the
// checkpoints must be equal bitwise (`checkpoint compare --rtol 0 --all`,
// optimizer state included). Processes, unlike thread ranks, each have
// their own default generator, so dropout's replay is checked under
// data parallelism, tensor parallelism and a pipeline.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/support/multi_rank.h"

namespace {

using paratrain::testing::run_cli;

struct Layout {
  std::string name;
  std::vector<std::string> sets;
  // What the recomputing run adds.
  std::vector<std::string> recompute = {"--set", "train.activation_checkpointing=blocks"};
  int ranks = 2;
};

TEST(ActivationCheckpointingCli, RecomputedRunsEqualPlainRunsBitwiseWithDropoutInRealProcesses) {
  const auto dir = paratrain::testing::temp_dir("recompute-cli");
  const auto config = dir + "/gpt.toml";
  std::ofstream(config) << "[run]\nname = \"gpt\"\noutput_dir = \"" << dir << "/runs\"\nlog_every = 0\nseed = 3\n"
                        << "[model]\nkind = \"gpt\"\nlayers = 3\nd_model = 32\nheads = 4\nseq_len = 16\n"
                        << "dropout = 0.1\n"
                        << "[optimizer]\nkind = \"adamw\"\nlr = 0.003\nclip_grad_norm = 1.0\n"
                        << "[data]\ndataset = \"text\"\npath = \"/usr/share/games/fortunes\"\nbatch_size = 8\n"
                        << "[train]\nepochs = 1\nmax_steps = 6\neval_every_epochs = 0\n";
  const std::vector<Layout> layouts = {
      {"ddp", {}},
      {"tp", {"--set", "parallel.tp=2"}},
      {"pp", {"--set", "parallel.pp=2", "--set", "pipeline.microbatches=4"}},
      // The tensor-parallel attention dropout stream replays too.
      {"tp_sp", {"--set", "parallel.tp=2", "--set", "parallel.megatron_sp=true"}},
      {"tp_pp_chunks",
       {"--set", "parallel.tp=2", "--set", "parallel.pp=2", "--set", "pipeline.microbatches=2"},
       {"--set", "pipeline.checkpoint_activations=true"},
       4},
      // The pipeline's own whole-chunk recompute replays dropout too.
      {"pp_chunks",
       {"--set", "parallel.pp=2", "--set", "pipeline.microbatches=4"},
       {"--set", "pipeline.checkpoint_activations=true"}},
  };
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.name);
    std::vector<std::string> checkpoints;
    for (const std::string mode : {"none", "blocks"}) {
      const std::string name = layout.name + "_" + mode;
      std::vector<std::string> args = {"launch", "--nproc-per-node", std::to_string(layout.ranks), "--", PARATRAIN_CLI, "train", "--config",
                                       config, "--set", "run.name=" + name};
      args.insert(args.end(), layout.sets.begin(), layout.sets.end());
      if (mode == "blocks") args.insert(args.end(), layout.recompute.begin(), layout.recompute.end());
      auto r = run_cli(args);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      if (mode == "blocks") {
        // The control: rank 0 recomputed (6 steps, at least one segment each).
        const auto at = r.output.find("recomputed in backward: ");
        ASSERT_NE(at, std::string::npos) << r.output;
        EXPECT_GE(std::stoll(r.output.substr(at + 24)), 6) << r.output;
      }
      checkpoints.push_back(dir + "/runs/" + name + "/version_0/checkpoints/step_00000006");
    }
    auto compare = run_cli({"checkpoint", "compare", "--rtol", "0", "--all", checkpoints[0], checkpoints[1]});
    EXPECT_EQ(compare.exit_code, 0) << compare.output;
  }
}

}  // namespace
