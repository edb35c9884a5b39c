// A parameter server SIGKILLed mid-run, with real processes: `paratrain
// train` on 2 workers and 1 server, the server killing itself after step 3
// (PARATRAIN_FAULT_KILL). The workers must exit with an error naming the
// server's role and rank, learnt from the closed connection rather than
// from world.timeout_s (set far beyond the test's run, so a hang or a
// timeout shows as the wrong message, not as a slow pass). The ranks are
// started directly, not under `paratrain launch`: a launcher stops the
// survivors once one rank dies, and what is tested is what they do alone.
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "paratrain/launch/free_port.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/launch/spawn.h"
#include "paratrain/launch/worker_env.h"
#include "tests/support/multi_rank.h"

extern char** environ;

namespace paratrain::param_server {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// 384 synthetic 6x6 images, batch 32 per worker: 6 steps an epoch, 12 in
// all; log_every = 0 so no logging collective meets the dead server first.
std::string write_config(const std::string& dir) {
  const std::string path = dir + "/ps.toml";
  std::ofstream(path) << "[run]\nname = \"ps_death\"\noutput_dir = \"" << dir << "/runs\"\nseed = 5\nlog_every = 0\n"
                      << R"([model]
hidden = [16]
[data]
dataset = "synthetic"
synthetic_train_size = 384
synthetic_test_size = 64
synthetic_image_size = 6
batch_size = 32
[train]
epochs = 2
[world]
timeout_s = 900
[ps]
servers = 1
mode = "sync"
)";
  return path;
}

struct Outcome {
  int status = 0;
  std::string log;
};

TEST(ServerDeath, WorkersOfAKilledServerFailFastNamingItsRoleAndRank) {
  const std::string dir = paratrain::testing::temp_dir("ps_death");
  const std::string config = write_config(dir);
  launch::LaunchOptions o;
  o.nproc_per_node = 3;
  o.master_addr = "127.0.0.1";
  o.master_port = launch::find_free_port();
  o.num_servers = 1;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string log = dir + "/rank" + std::to_string(rank) + ".log";
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << log;
    launch::SpawnSpec spec;
    spec.path = PARATRAIN_CLI;
    spec.argv = {PARATRAIN_CLI, "train", "-c", config};
    spec.env = launch::worker_environment(o, rank, environ);
    spec.env.push_back("PARATRAIN_FAULT_KILL=2:3");
    spec.stdout_fd = fd;
    spec.stderr_fd = fd;
    pids.push_back(launch::spawn_in_new_group(spec));
    close(fd);
  }
  std::vector<Outcome> out(3);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(waitpid(pids[rank], &out[rank].status, 0), pids[rank]);
    out[rank].log = slurp(dir + "/rank" + std::to_string(rank) + ".log");
  }
  ASSERT_TRUE(WIFSIGNALED(out[2].status)) << "the server was to kill itself:\n" << out[2].log;
  EXPECT_EQ(WTERMSIG(out[2].status), SIGKILL);
  for (int w = 0; w < 2; ++w) {
    const auto& log = out[w].log;
    ASSERT_TRUE(WIFEXITED(out[w].status)) << "worker " << w << " did not exit by itself:\n" << log;
    EXPECT_NE(WEXITSTATUS(out[w].status), 0) << log;
    EXPECT_NE(log.find("worker " + std::to_string(w) + " (rank " + std::to_string(w) + "): push/pull of clock 4 "
                       "with parameter server 0 (rank 2)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("the parameter server probably died"), std::string::npos) << log;
    EXPECT_EQ(log.find("imed out"), std::string::npos) << "a timeout, not the closed connection:\n" << log;
  }
}

}  // namespace
}  // namespace paratrain::param_server
