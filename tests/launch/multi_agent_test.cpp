// Multi-agent elastic launches end to end: two `paratrain launch` agents on
// this host act as two nodes (distinct --node-id, one worker each) meeting at
// one --rdzv-endpoint on loopback. Real processes on purpose: what is tested
// is agents and workers dying and the survivors meeting again. Few tests, each
// a few seconds of training.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "paratrain/launch/free_port.h"
#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

extern char** environ;

namespace paratrain::launch {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// `train_size` synthetic 8x8 images, batch 16 per rank (128: 4 steps an
// epoch on 2 ranks), a checkpoint every 4 steps.
std::string write_config(const std::string& dir, int train_size, int epochs = 2, const std::string& world = "") {
  const std::string path = dir + "/elastic.toml";
  std::ofstream(path) << "[run]\nname = \"elastic\"\nseed = 3\nlog_every = 4\n[model]\nhidden = [16]\n"
                      << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = " << train_size
                      << "\nsynthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = 16\n"
                      << "[train]\nepochs = " << epochs << "\ncheckpoint_every_steps = 4\n[world]\ntimeout_s = 60\n" << world;
  return path;
}

// One agent: `paratrain launch` in the background, its output in a file.
struct Agent {
  pid_t pid = -1;
  std::string log;
  int wait_exit() {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output() const { return test::slurp(log); }
  ~Agent() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

void start_agent(Agent& agent, const std::string& log, const std::vector<std::string>& args,
                 const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv = {PARATRAIN_CLI, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  agent.log = log;
  agent.pid = testing::spawn_logged(argv, log, extra_env);
  ASSERT_GT(agent.pid, 0);
}

std::vector<std::string> agent_args(const std::string& node, const std::string& endpoint, const std::string& nnodes,
                                    const std::string& config, const std::string& out, int max_restarts,
                                    double last_call) {
  return {"--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", "job-" + out.substr(out.size() - 1),
          "--node-id", node, "--max-restarts", std::to_string(max_restarts), "--rdzv-last-call",
          std::to_string(last_call), "--rdzv-keep-alive-timeout", "5", "--rdzv-timeout", "60", "--kill-grace", "2",
          "--", PARATRAIN_CLI, "train", "-c", config, "--set", "run.output_dir=" + out};
}

fs::path checkpoints(const std::string& out) {
  return fs::path(out) / "elastic" / "version_0" / "checkpoints";
}

bool wait_for(const std::function<bool()>& what, std::chrono::seconds limit = 120s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!what()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> kids;
  std::ifstream in(fmt::format("/proc/{}/task/{}/children", pid, pid));
  for (pid_t k; in >> k;) kids.push_back(k);
  return kids;
}

// Node a serves the store: started first, and waited for, so that killing
// node b never takes the store down (the endpoint's agent must outlive the job).
void wait_until_serving(const Agent& a) {
  ASSERT_TRUE(wait_for([&] { return a.output().find("serves the rendezvous store") != std::string::npos; }, 60s))
      << a.output();
}

std::string endpoint() {
  return "127.0.0.1:" + std::to_string(find_free_port());
}

TEST(MultiAgent, AKilledWorkerMakesBothAgentsMeetAgainAndTheRunEqualsTheCheckpointResumedByHand) {
  const std::string dir = testing::temp_dir("multi_agent_a");
  const std::string config = write_config(dir, 128, 3);  // 12 steps on 2 ranks
  const std::string ep = endpoint();
  Agent a, b;
  // Rank 1 (node "b", ranked after "a") SIGKILLs itself after step 5. With
  // the job's token: the agent store is the authenticated one.
  const std::vector<std::string> env = {"PARATRAIN_FAULT_KILL=1:5", "PARATRAIN_JOB_TOKEN=multi-agent-test-secret"};
  start_agent(a, dir + "/a.log", agent_args("a", ep, "1:2", config, dir + "/A", 2, 30), env);
  wait_until_serving(a);
  start_agent(b, dir + "/b.log", agent_args("b", ep, "1:2", config, dir + "/A", 2, 30), env);
  const int code_a = a.wait_exit(), code_b = b.wait_exit();
  const std::string log = a.output() + "\n----- b -----\n" + b.output();
  ASSERT_EQ(code_a, 0) << log;
  ASSERT_EQ(code_b, 0) << log;
  EXPECT_NE(log.find("rendezvous generation 0 of job 'job-A': 2 nodes (a, b)"), std::string::npos) << log;
  EXPECT_NE(log.find("rendezvous generation 1 of job 'job-A': 2 nodes (a, b)"), std::string::npos) << log;
  EXPECT_NE(b.output().find("generation 0 failed: rank 1"), std::string::npos) << log;
  static const std::regex resumed(R"(resumed from (\S+) at epoch \d+, batch \d+, step (\d+))");
  std::smatch m;
  const std::string out_a = a.output();
  ASSERT_TRUE(std::regex_search(out_a, m, resumed)) << log;
  const std::string checkpoint = m[1];
  EXPECT_EQ(m[2], "4") << log;
  const auto final_a = checkpoints(dir + "/A") / "step_00000012";
  ASSERT_TRUE(fs::exists(final_a / "index.json")) << log;

  // The same checkpoint resumed by hand on one node with 2 ranks.
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {PARATRAIN_CLI, "train", "-c", config, "--set", "run.output_dir=" + dir + "/B", "--set",
               "train.resume=" + checkpoint};
  const auto hand = test::run_captured(o, dir);
  ASSERT_EQ(hand.report.exit_code, 0) << hand.err;
  const auto final_b = checkpoints(dir + "/B") / "step_00000012";
  const auto same = testing::run_cli({"checkpoint", "compare", final_a.string(), final_b.string(), "--all", "--rtol", "1e-5"});
  EXPECT_EQ(same.exit_code, 0) << same.output;
  // Negative control: the comparison sees eight steps of training.
  const auto differs = testing::run_cli({"checkpoint", "compare", final_a.string(), checkpoint, "--rtol", "1e-5"});
  EXPECT_NE(differs.exit_code, 0) << differs.output;
}

TEST(MultiAgent, AKilledNodeLeavesTheSurvivorToFinishAtWorldSizeOne) {
  const std::string dir = testing::temp_dir("multi_agent_b");
  const std::string config = write_config(dir, 2048);  // 128 steps on 2 ranks
  const std::string ep = endpoint();
  Agent a, b;
  start_agent(a, dir + "/a.log", agent_args("a", ep, "1:2", config, dir + "/B", 1, 3));
  wait_until_serving(a);
  start_agent(b, dir + "/b.log", agent_args("b", ep, "1:2", config, dir + "/B", 1, 3));
  // After the first checkpoint, node b dies whole: its agent and its worker.
  ASSERT_TRUE(wait_for([&] { return fs::exists(checkpoints(dir + "/B") / "step_00000004" / "index.json"); }))
      << a.output() << b.output();
  const auto workers = children_of(b.pid);
  kill(b.pid, SIGKILL);
  for (pid_t w : workers) kill(w, SIGKILL);
  b.wait_exit();
  const int code_a = a.wait_exit();
  const std::string log = a.output();
  ASSERT_EQ(code_a, 0) << log << "\n----- b -----\n" << b.output();
  EXPECT_NE(log.find("rendezvous generation 0 of job 'job-B': 2 nodes (a, b); node 'a' is node rank 0, world size 2"),
            std::string::npos) << log;
  EXPECT_NE(log.find("rendezvous generation 1 of job 'job-B': 1 node (a); node 'a' is node rank 0, world size 1"),
            std::string::npos) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(checkpoints(dir + "/B") / "step_00000128" / "index.json")) << log;
}

TEST(MultiAgent, ANodeJoiningARunningJobIsAbsorbedAtTheNextGeneration) {
  const std::string dir = testing::temp_dir("multi_agent_c");
  // No heartbeats: the test holds generation 0's worker stopped (below), which
  // the launcher would otherwise report as a hang.
  const std::string config = write_config(dir, 8192, 2, "heartbeat_s = 0\n");
  const std::string ep = endpoint();
  Agent a, b;
  // Node a alone: generation 0 at world size 1 (MIN = 1, a short last call).
  // No restarts allowed: a membership change is not a failure.
  start_agent(a, dir + "/a.log", agent_args("a", ep, "1:2", config, dir + "/C", 0, 1));
  ASSERT_TRUE(wait_for([&] { return fs::exists(checkpoints(dir + "/C") / "step_00000008" / "index.json"); }))
      << a.output();
  // Training is fast: hold the worker (SIGSTOP) so that generation 0 is
  // surely still running when node b arrives. Its agent stops it (SIGTERM,
  // then SIGKILL) to re-rendezvous.
  const auto workers = children_of(a.pid);
  ASSERT_EQ(workers.size(), 1u) << a.output();
  kill(workers[0], SIGSTOP);
  ASSERT_EQ(a.output().find("done:"), std::string::npos) << "generation 0 finished before it could be held";
  start_agent(b, dir + "/b.log", agent_args("b", ep, "1:2", config, dir + "/C", 0, 1));
  const int code_a = a.wait_exit(), code_b = b.wait_exit();
  const std::string log = a.output() + "\n----- b -----\n" + b.output();
  ASSERT_EQ(code_a, 0) << log;
  ASSERT_EQ(code_b, 0) << log;
  EXPECT_NE(log.find("rendezvous generation 0 of job 'job-C': 1 node (a); node 'a' is node rank 0, world size 1"),
            std::string::npos) << log;
  EXPECT_NE(log.find("rendezvous generation 1 of job 'job-C': 2 nodes (a, b); node 'a' is node rank 0, world size 2"),
            std::string::npos) << log;
  EXPECT_NE(log.find("does not count as a restart"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
}

}  // namespace
}  // namespace paratrain::launch
